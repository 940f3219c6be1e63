"""Module paths from before the packages were regrouped (kafka_changelog/moved_modules.py)
import as the modules where they live now, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from kafka_changelog.moved_modules import MOVED_MODULES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_is_the_module_at_its_new_path(old: str) -> None:
    new = MOVED_MODULES[old]
    assert not ROOT.joinpath(*old.split(".")).with_suffix(".py").exists(), old
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"module {old} moved to {new}"):
        aliased = importlib.import_module(old)
    assert aliased is importlib.import_module(new)


def test_a_documented_import_of_before_still_works() -> None:
    sys.modules.pop("kafka_changelog.state.descriptors", None)
    with pytest.warns(DeprecationWarning):
        from kafka_changelog.state.descriptors import value_state
    from kafka_changelog.state import value_state as public

    assert value_state is public
