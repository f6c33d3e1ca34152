"""Report helpers on rows as written to disk."""

from __future__ import annotations

import pandas as pd

from reproflow.reporting.report import load_results, to_markdown


def test_rows_from_before_a_parameter_existed_get_its_default(tmp_path):
    point = tmp_path / "s" / "e"
    point.mkdir(parents=True)
    # A param_comms row written before `implementation` was declared.
    pd.DataFrame([{"schema_version": 1, "suite": "s", "experiment": "e", "family": "param_comms", "point": "p",
                   "collective": "all_reduce", "metric": "busbw", "value": 1.0, "rank": "all"}]).to_csv(
        point / "old.csv", index=False)
    frame = load_results(tmp_path)
    assert frame["implementation"].tolist() == ["reproflow"]
    assert frame["begin_size"].tolist() == [1024] and frame["check"].tolist() == [True]


def test_markdown_leaves_missing_cells_empty_and_keeps_integers():
    text = to_markdown(pd.DataFrame({"a": [1.0, float("nan")], "b": ["x", None]}))
    assert text.splitlines()[2:] == ["| 1 | x |", "|  |  |"]
