"""What a stateful function may return as its output rows, and the error for anything else."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from spark_integration.streaming.output_rows import OutputColumnsError, output_records


def test_rows_as_a_frame_a_dict_a_list_or_a_generator() -> None:
    assert output_records(None, key="u") == []
    assert output_records(pd.DataFrame({"user": ["u"], "n": [2]}), key="u") == [
        {"user": "u", "n": 2}]
    assert output_records({"user": "u", "n": 2}, key="u") == [{"user": "u", "n": 2}]
    assert output_records([{"n": 1}, {"n": 2}], key="u") == [{"n": 1}, {"n": 2}]
    assert output_records(({"n": i} for i in range(2)), key="u") == [{"n": 0}, {"n": 1}]
    assert output_records([], key="u") == []


@pytest.mark.parametrize(("produced", "what"), [
    ("user-7", "str 'user-7'"),
    (42, "int 42"),
    ([("u", 1)], "a list holding tuple ('u', 1)"),
    ([{"n": 1}, "oops"], "a list holding str 'oops'"),
])
def test_anything_else_names_the_key_and_what_came_back(produced: object, what: str) -> None:
    with pytest.raises(TypeError, match=re.escape(
            f"the stateful function returned {what} for key 'user-7': return the output "
            "rows as a pandas DataFrame, a dict (one row), a list of dicts, or None")):
        output_records(produced, key="user-7")


def test_a_vectorised_call_is_named_as_such() -> None:
    with pytest.raises(TypeError, match="returned int 3 for a subtask's rows: return"):
        output_records(3)


COLUMNS = frozenset({"user", "events"})


def test_rows_must_have_exactly_the_output_schema_columns() -> None:
    rows = [{"user": "u", "events": 2}, {"events": 3, "user": "v"}]
    assert output_records(rows, COLUMNS, "u") == rows
    assert output_records(pd.DataFrame(rows), COLUMNS, "u") == rows
    with pytest.raises(OutputColumnsError, match=re.escape(
            "an output row for key 'user-7' has columns ['event', 'user'], but output_schema "
            "names ['events', 'user']: unknown ['event'], missing ['events']. Return every "
            "output_schema column by name")):
        output_records({"user": "user-7", "event": 1}, COLUMNS, "user-7")
    with pytest.raises(OutputColumnsError, match=re.escape("missing ['events']")):
        output_records([{"user": "u", "events": 1}, {"user": "u"}], COLUMNS, "u")
    with pytest.raises(OutputColumnsError, match=re.escape(
            "an output row for a subtask's rows has columns ['events', 'spent', 'user'], but "
            "output_schema names ['events', 'user']: unknown ['spent']")):
        output_records(pd.DataFrame({"user": ["u"], "events": [1], "spent": [2.0]}), COLUMNS)
