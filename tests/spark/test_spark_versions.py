"""Which PySpark releases the library runs on, and what it says about the others
(spark_integration/sessions/spark_versions.py). The compatibility run
(``scripts/compat.sh spark``) runs these and the Spark tests it names on each release."""

from __future__ import annotations

import pytest

from spark_integration.sessions.spark_versions import (
    TESTED_RELEASES,
    SparkFeature,
    UnsupportedSparkVersionError,
    installed_version,
    missing,
    require_supported_spark,
    supports,
)


@pytest.mark.parametrize("version", ["4.0.0", "4.0.1", "4.1.1", "4.2.0", "4.2.0.dev1"])
def test_the_supported_releases_are_accepted(version: str) -> None:
    assert require_supported_spark(version)[:2] in ((4, 0), (4, 1), (4, 2))


def test_the_installed_pyspark_is_a_tested_release() -> None:
    assert installed_version() in TESTED_RELEASES
    require_supported_spark()


@pytest.mark.parametrize(("version", "why"), [
    ("3.5.3", "older than 4.0: Spark 3 runs Scala 2.12 and has no Python data source API"),
    ("4.3.0", "newer than 4.2, the newest release tested"),
    ("5.0.0", "newer than 4.2, the newest release tested"),
])
def test_an_unsupported_release_is_refused_naming_it_and_the_supported_ones(
        version: str, why: str) -> None:
    with pytest.raises(UnsupportedSparkVersionError) as refused:
        require_supported_spark(version)
    message = str(refused.value)
    assert message.startswith(f"PySpark {version} is not supported ({why}")
    assert "supported: PySpark 4.0, 4.1, 4.2 (tested: 4.0.0, 4.1.1, 4.2.0)" in message
    assert "pip install 'pyspark>=4.0.0,<4.3'" in message


def test_a_version_that_is_not_one_is_refused() -> None:
    with pytest.raises(UnsupportedSparkVersionError, match="cannot read the PySpark version 'x'"):
        require_supported_spark("x")


def test_each_feature_is_there_from_its_release_on() -> None:
    assert [supports(SparkFeature.READER_FILTER_PUSHDOWN, v) for v in TESTED_RELEASES] == [
        False, True, True]
    assert [supports(SparkFeature.SUBTASK_PLACEMENT, v) for v in TESTED_RELEASES] == [
        False, True, True]
    assert [supports(SparkFeature.STREAM_AVAILABLE_NOW, v) for v in TESTED_RELEASES] == [
        False, False, True]


def test_a_missing_feature_says_what_needs_it_and_what_is_done_instead() -> None:
    assert missing(SparkFeature.READER_FILTER_PUSHDOWN, "4.0.0") == (
        "filter pushdown of Python data sources (option pushdown) needs PySpark 4.1 or later "
        "(installed: 4.0.0): every key group is read and Spark applies the filters to the "
        "rows (same rows, more read)")
    assert "needs PySpark 4.2 or later (installed: 4.1.1)" in missing(
        SparkFeature.STREAM_AVAILABLE_NOW, "4.1.1")


def test_pushdown_on_a_spark_without_it_reads_every_key_group_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from spark_integration.reader.pushdown import pushdown_enabled
    from spark_integration.sessions import spark_versions

    monkeypatch.setattr(spark_versions, "installed_version", lambda: "4.0.0")
    with caplog.at_level("WARNING", logger="spark_integration.reader.pushdown"):
        assert pushdown_enabled({"pushdown": "true"}) is False
    assert caplog.messages == [
        "format('kafka-changelog') option pushdown=true: filter pushdown of Python data "
        "sources (option pushdown) needs PySpark 4.1 or later (installed: 4.0.0): every key "
        "group is read and Spark applies the filters to the rows (same rows, more read)"]
    monkeypatch.setattr(spark_versions, "installed_version", lambda: "4.1.1")
    assert pushdown_enabled({"pushdown": "true"}) is True


@pytest.mark.spark
def test_register_turns_on_what_each_release_needs(
        spark: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_integration import register
    from spark_integration.reader.datasource import AVAILABLE_NOW_WRAPPER_CONF, PUSHDOWN_CONF
    from spark_integration.sessions import spark_versions

    conf = spark.conf  # type: ignore[attr-defined]
    before = {key: conf.get(key, None) for key in (AVAILABLE_NOW_WRAPPER_CONF, PUSHDOWN_CONF)}
    try:
        for key in before:
            conf.unset(key)
        monkeypatch.setattr(spark_versions, "installed_version", lambda: "4.0.0")
        register(spark)
        # 4.0: Spark's AvailableNow wrapper for the change feed; no pushdown to turn on.
        assert conf.get(AVAILABLE_NOW_WRAPPER_CONF, None) == "true"
        assert conf.get(PUSHDOWN_CONF, None) in (None, "false")
        conf.unset(AVAILABLE_NOW_WRAPPER_CONF)
        monkeypatch.setattr(spark_versions, "installed_version", lambda: "4.2.0")
        register(spark)
        assert conf.get(PUSHDOWN_CONF, None) == "true"
        assert conf.get(AVAILABLE_NOW_WRAPPER_CONF, None) in (None, "false")
        monkeypatch.setattr(spark_versions, "installed_version", lambda: "4.3.0")
        with pytest.raises(UnsupportedSparkVersionError, match=r"PySpark 4\.3\.0 is not supported"):
            register(spark)
    finally:
        for key, value in before.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)


def test_the_set_up_installs_the_newest_tested_release() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    setup = (root / "scripts" / "setup.sh").read_text()
    assert re.findall(r"^SPARK_RELEASE=(\S+)$", setup, re.M) == [TESTED_RELEASES[-1]]
    image = (root / "docker" / "Dockerfile").read_text()
    assert re.findall(r"^ARG SPARK_RELEASE=(\S+)$", image, re.M) == [TESTED_RELEASES[-1]]


def test_a_pyspark_without_package_metadata_is_read_from_its_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark distribution's ``python`` directory on the path has no package metadata."""
    import importlib.metadata

    import pyspark

    def no_metadata(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", no_metadata)
    installed_version.cache_clear()
    try:
        assert installed_version() == pyspark.__version__
    finally:
        installed_version.cache_clear()
