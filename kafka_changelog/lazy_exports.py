"""A package's public names, imported from their modules when first read.

A package ``__init__`` declares its exports once, as ``from .module import Name``
statements inside ``if TYPE_CHECKING:`` (what readers and type checkers see), and calls
:func:`install` with its ``globals()``. Importing one module of the library then no
longer imports every module its packages export: the CLI and the materialization job
processes start without pandas, and a worker imports what its task uses.

Invariant: a name read through the package is the very object its module defines
(``isinstance``, pickles and identity are unchanged); it is cached in the package after
the first read.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def declared_exports(init_file: str) -> dict[str, tuple[str, str]]:
    """Name -> (relative module, name in it) of the ``if TYPE_CHECKING:`` imports of
    ``init_file``."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    exports: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom):
                module = "." * statement.level + (statement.module or "")
                for alias in statement.names:
                    exports[alias.asname or alias.name] = (module, alias.name)
    return exports


def install(namespace: dict[str, Any]) -> None:
    """Give the package whose ``globals()`` is ``namespace`` a module ``__getattr__`` and
    ``__dir__`` serving its declared exports."""
    package: str = namespace["__name__"]
    init_file: str = namespace["__file__"]
    exports: dict[str, tuple[str, str]] = {}

    def find(name: str) -> tuple[str, str] | None:
        if not exports:
            exports.update(declared_exports(init_file))
        return exports.get(name)

    def __getattr__(name: str) -> Any:
        found = find(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = found
        value = getattr(importlib.import_module(module, package), attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        find("")
        return sorted(set(namespace) | set(exports))

    getattr_hook: Callable[[str], Any] = __getattr__
    namespace["__getattr__"] = getattr_hook
    namespace["__dir__"] = __dir__
