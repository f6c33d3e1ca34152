"""A profile in rounds: the suite takes its turns over the micro-batches, and the database takes each op's
median over the rounds of the newest suite, so one slow spell of the machine moves no op."""

from __future__ import annotations

import csv
import statistics
import tempfile
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reproflow.families.aceso.database import FIELDS, write_from_rows
from reproflow.families.aceso.pipeline import profile_suite


def _rows(suite: str, when: str, rnd: int, scale: float) -> list[dict[str, object]]:
    """One round's rows of two ops of GPT-tiny, micro-batch 2, every field `scale` times its index."""
    return [{"family": "aceso", "suite": suite, "kind": "ops", "model": "gpt", "size": "tiny", "mbs": 2, "tp": 1,
             "algo": 0, "round": rnd, "op_index": i, "op": op, "metric": f, "value": scale * (k + 1),
             "timestamp": when, "device": "cpu"}
            for i, op in enumerate(("a", "b")) for k, f in enumerate(FIELDS)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=3, max_size=7), st.floats(2.0, 50.0), st.data())
def test_a_profile_in_rounds_takes_each_ops_median(speeds: list[float], slow: float, data: st.DataObject) -> None:
    """Any round may run at any speed, one of them in a slowdown of any size: each op's value is the median
    of the rounds of the newest suite, and an older suite's rows count for nothing."""
    spell = data.draw(st.integers(0, len(speeds) - 1))
    speeds = [s * slow if i == spell else s for i, s in enumerate(speeds)]
    rows = [r for i, s in enumerate(speeds) for r in _rows("aceso-profile-gpt_tiny", f"2026-01-01T00:00:{i:02d}",
                                                          i + 1, s)]
    rows += _rows("aceso-profile-old", "2025-01-01T00:00:00", 1, 1000.0)
    with tempfile.TemporaryDirectory() as tmp:
        write_from_rows(pd.DataFrame(rows), Path(tmp))
        table = list(csv.reader((Path(tmp) / "gpt_tiny_mbs2_tp1_algo0.csv").open()))
    median = statistics.median(speeds)
    for row in table[1:]:
        for k, value in enumerate(row[1:]):
            assert float(value) == pytest.approx(median * (k + 1), rel=1e-3, abs=1e-3)


def test_a_profile_in_rounds_takes_its_turns_over_the_micro_batches() -> None:
    """Round-major: every micro-batch and algo once per round, each round with its share of the repeats
    (rounded up) and of the seconds; one round is the reference's suite."""
    suite = tomllib.loads(profile_suite("gpt", "tiny", [1, 2], [1], 64, 2, 10, "0-4", rounds=3, repeat_seconds=2.0))
    ops = suite["experiment"][0]
    assert ops["matrix"] == {"round": [1, 2, 3], "mbs": [1, 2], "algo": [0, 1]}
    assert ops["params"]["repeats"] == 4 and ops["params"]["repeat_seconds"] == 2.0 / 3
    once = tomllib.loads(profile_suite("gpt", "tiny", [1, 2], [1], 64, 2, 10, "0-4"))["experiment"][0]
    assert "round" not in once["matrix"] and once["params"]["repeats"] == 10 and "repeat_seconds" not in once["params"]
