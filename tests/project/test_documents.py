"""The documents agree with the code and with each other: the version is the changelog's
latest release, every Python example is run by a test, and relative links resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kafka_changelog

ROOT = Path(__file__).resolve().parents[2]
#: Documents whose ``python`` blocks a test runs: README.md and the Spark guides in
#: test_readme_examples.py (against a broker and Spark, each in a fresh interpreter), the
#: in-process documents in test_docs_examples.py. A new document with examples must join one
#: of them.
RUN_EXAMPLES = {
    "README.md",
    "docs/reading.md",
    "docs/streaming.md",
    "docs/writing-state.md",
    "docs/time.md",
    "docs/exactly-once.md",
    "docs/operations.md",
    "docs/state.md",
    "docs/spark.md",
    "docs/schema-evolution.md",
    "docs/rewind.md",
    "docs/fork.md",
}
#: Documents whose ``python`` blocks are fragments, not programs (a record's ``value`` from
#: elsewhere), so no test runs them.
FRAGMENTS = {"docs/kafka-storage.md"}
#: Documents whose ``python`` blocks need a secured broker: docs/security.md's profiles are
#: connected with by tests/kafka/test_kafka_tls.py, its configuration example is what
#: tests/spark/test_secured_streaming.py runs against a SASL_SSL broker.
SECURED = {"docs/security.md"}
#: The documents whose links are checked.
LINKED = ("README.md", "CHANGELOG.md", "docs/spark.md", "docs/reading.md", "docs/streaming.md",
          "docs/writing-state.md",
          "docs/time.md", "docs/exactly-once.md", "docs/spark-connect.md",
          "docs/spark-internals.md", "docs/ARCHITECTURE.md",
          "docs/state.md", "docs/kafka-storage.md", "docs/snapshots-and-checkpoints.md",
          "docs/security.md", "docs/operations.md",
          "docs/schema-evolution.md",
          "docs/rewind.md",
          "docs/fork.md",
          "benchmarks/README.md", "benchmarks/HISTORY.md")

RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\]", re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def markdown_files() -> list[Path]:
    skip = {".git", ".venv", "node_modules"}
    return sorted(path for path in ROOT.rglob("*.md")
                  if not skip.intersection(path.relative_to(ROOT).parts))


def test_the_version_is_the_latest_release_in_the_changelog() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = RELEASE.findall(changelog)
    assert releases, "CHANGELOG.md names no released version ('## [x.y.z]')"
    assert kafka_changelog.__version__ == releases[0], (
        f"kafka_changelog.__version__ is {kafka_changelog.__version__}, the latest release in "
        f"CHANGELOG.md is {releases[0]}")
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{releases[0]}]")


def test_every_document_with_python_examples_has_them_run_by_a_test() -> None:
    with_examples = {str(path.relative_to(ROOT)) for path in markdown_files()
                     if "```python\n" in path.read_text(encoding="utf-8")}
    expected = RUN_EXAMPLES | FRAGMENTS | SECURED
    assert with_examples == expected, (
        "documents with python examples that no test runs (or a runner without examples): "
        f"{sorted(with_examples ^ expected)}")


def test_the_examples_are_run_by_the_tests_named_above() -> None:
    from tests.project.test_docs_examples import IN_PROCESS_DOCS
    from tests.project.test_readme_examples import BROKER_DOCS
    run = set(BROKER_DOCS) | {f"docs/{name}" for name in IN_PROCESS_DOCS}
    assert run == RUN_EXAMPLES, sorted(run ^ RUN_EXAMPLES)


def test_the_readme_lists_every_document() -> None:
    """README.md's "Documentation" list links every document of docs/, one item each."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^- \[[^\]]*\]\(([^)#]+)\)", section, re.M)
    documents = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))
    assert sorted(set(items) & set(documents)) == documents, (
        f"documents the README's list does not link: {sorted(set(documents) - set(items))}")
    assert len(items) == len(set(items)), "a document listed twice"
    assert all(name in LINKED for name in documents), (
        f"documents whose links no test checks: {sorted(set(documents) - set(LINKED))}")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def resolves(linked: Path, anchor: str) -> bool:
    """The file exists, and so does the anchor in it (a markdown file's heading)."""
    if not linked.exists():
        return False
    return not anchor or linked.suffix != ".md" or anchor in anchors(
        linked.read_text(encoding="utf-8"))


@pytest.mark.parametrize("document", LINKED)
def test_relative_links_resolve(document: str) -> None:
    path = ROOT / document
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not resolves(linked, anchor):
            broken.append(target)
    assert not broken, f"{document}: broken links {broken}"
