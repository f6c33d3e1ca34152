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


def test_the_claims_table_gives_each_case_its_own_line():
    """A claim's `where` lists its cases one a line on the page, commas inside intervals kept."""
    from conftest import one_case_claim

    from reproflow.reporting.page import _html_claims, case_lines

    where = "gpt 1.17x [0.96, 1.41], moe 2.50x [2.1, 2.9]; 4 ranks gloo/cpu"
    assert case_lines(where) == ["gpt 1.17x [0.96, 1.41],", "moe 2.50x [2.1, 2.9];", "4 ranks gloo/cpu"]
    page = _html_claims([one_case_claim(1.17, detail=where)])
    assert "gpt 1.17x [0.96, 1.41],<br>moe 2.50x [2.1, 2.9];<br>4 ranks gloo/cpu" in page
