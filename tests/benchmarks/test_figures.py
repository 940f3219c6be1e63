"""benchmarks/README.md's table of current figures is what ``python -m benchmarks.figures``
generates from the committed results, and every committed result file is accounted for."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import figures


def test_the_readme_table_is_generated_from_the_committed_results() -> None:
    readme = figures.README.read_text(encoding="utf-8")
    assert figures.table_in(readme) == figures.render(figures.rows()), (
        "benchmarks/README.md's table is stale: run python -m benchmarks.figures")
    assert figures.main(["--check"]) == 0


def test_every_result_file_is_in_the_table_or_named_in_the_benchmark_docs() -> None:
    named = (figures.README.read_text(encoding="utf-8")
             + (figures.BENCHMARKS_DIR / "HISTORY.md").read_text(encoding="utf-8"))
    in_table = {name for name, _ in figures.SOURCES}
    unaccounted = [path.name for path in sorted(figures.RESULTS_DIR.iterdir())
                   if path.name not in in_table and f"results/{path.name}" not in named]
    assert not unaccounted, f"result files neither in the table nor named: {unaccounted}"


def test_rewriting_touches_only_what_is_between_the_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n\n{figures.BEGIN}\n| old |\n{figures.END}\n\nafter\n",
                      encoding="utf-8")
    assert figures.main(["--check", "--readme", str(readme)]) == 1
    assert figures.main(["--readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith(f"# Title\n\nbefore\n\n{figures.BEGIN}\n| benchmark |")
    assert text.endswith(f" |\n{figures.END}\n\nafter\n")
    assert figures.main(["--check", "--readme", str(readme)]) == 0
    readme.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(ValueError, match="markers"):
        figures.main(["--readme", str(readme)])


def test_targets_split_into_a_figure_and_its_bound() -> None:
    assert figures.split_target("median <= 0.3x the faster Spark operator's") == (
        "median / the faster Spark operator's", "≤ 0.3x")
    assert figures.split_target("subtasks restored from Kafka in measured batches = 0") == (
        "subtasks restored from Kafka in measured batches", "= 0")
    assert figures.split_target("something else") == ("something else", "—")


@pytest.mark.skipif(not (figures.BENCHMARKS_DIR.parent / ".git").exists(),
                    reason="not a git checkout")
def test_a_file_without_commit_and_date_takes_them_from_git() -> None:
    path = figures.RESULTS_DIR / "latest.json"
    commit, date = figures.provenance(path, {})
    assert len(commit) >= 7 and len(date) == 10 and date[4] == "-"
