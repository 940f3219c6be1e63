"""Packages export their public names lazily, and the light entry points stay light."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from kafka_changelog.lazy_exports import declared_exports

LAZY_PACKAGES = ("kafka_changelog", "kafka_changelog.state", "kafka_changelog.kafka",
                 "spark_integration.streaming")


@pytest.mark.parametrize("package_name", LAZY_PACKAGES)
def test_every_exported_name_is_the_object_its_module_defines(package_name: str) -> None:
    package = importlib.import_module(package_name)
    assert package.__file__ is not None
    declared = declared_exports(package.__file__)
    assert declared, package_name
    for name, (module, attribute) in declared.items():
        defined = getattr(importlib.import_module(module, package_name), attribute)
        assert getattr(package, name) is defined, f"{package_name}.{name}"
    # Everything in __all__ is either declared lazily or imported eagerly, and importable.
    for name in package.__all__:
        getattr(package, name)
    assert set(declared) <= set(package.__all__)
    assert set(declared) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    import kafka_changelog.state

    with pytest.raises(AttributeError) as refused:
        kafka_changelog.state.Nope  # noqa: B018
    assert str(refused.value) == "module 'kafka_changelog.state' has no attribute 'Nope'"


@pytest.mark.parametrize("entry_point", ["kafka_changelog.cli.main",
                                         "kafka_changelog.kafka.job_process"])
def test_the_cli_and_the_materialization_process_start_without_pandas(entry_point: str) -> None:
    # Each materialization job is a process of its own, and the CLI a command users type:
    # pandas alone costs them a third of a CPU-second at start.
    done = subprocess.run(
        [sys.executable, "-c", f"import sys, {entry_point}; print('pandas' in sys.modules)"],
        capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_python_worker_unpickling_a_task_imports_no_driver_module() -> None:
    # Every Python worker Spark starts imports the task's module: the driver's planning
    # (and its imports) would be paid again at each worker's start.
    done = subprocess.run(
        [sys.executable, "-c", "import sys, spark_integration.streaming.task; "
         "print('spark_integration.streaming.driver' in sys.modules)"],
        capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_data_source_plans_without_the_read_path_or_pandas() -> None:
    # Spark plans a Python data source in processes of their own (its planner, and a
    # runner process per streaming query, started anew each time): they import the data
    # source's module and nothing of the read path.
    done = subprocess.run(
        [sys.executable, "-c", "import sys, spark_integration.reader.datasource; "
         "print(sorted(m for m in ('pandas', 'spark_integration.reader.task_reading', "
         "'spark_integration.reader.feed_reading') if m in sys.modules))"],
        capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
