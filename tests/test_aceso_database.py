"""A profile in rounds: the suite takes its turns over the micro-batches, and the database takes each op's
median over the rounds of the newest suite, so one slow spell of the machine moves no op; the search's
near-tie rule leaves to a fixed order what the profile cannot resolve."""

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
from reproflow.families.aceso.search import settle


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


candidates = st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(st.floats(1.0, 100.0), min_size=n, max_size=n), st.permutations(range(n))))


@settings(max_examples=300, deadline=None)
@given(candidates, st.floats(0.0, 0.05), st.floats(0.2, 5.0))
def test_the_near_tie_rule_keeps_the_first_by_order_within_the_resolution(case: tuple, resolution: float,
                                                                          speed: float) -> None:
    """The kept candidate is the first by the fixed order among those predicted within the resolution of
    the fastest; one further than that is never kept; the pick does not move when the machine is uniformly
    faster or slower, nor with the order the candidates are listed in; no resolution keeps the fastest."""
    times, order = case
    kept, tied = settle(times, order, resolution)
    fastest = min(times)
    assert sorted(tied) == [i for i in range(len(times)) if times[i] <= fastest * (1 + resolution)]
    assert kept == min(tied, key=lambda i: order[i]) and times[kept] <= fastest * (1 + resolution)
    assert settle([t * speed for t in times], order, resolution)[0] == kept or \
        any(abs(t * speed - fastest * speed * (1 + resolution)) < 1e-9 * t for t in times)  # float edge
    shuffled = list(reversed(range(len(times))))
    again, _ = settle([times[i] for i in shuffled], [order[i] for i in shuffled], resolution)
    assert shuffled[again] == kept
    assert times[settle(times, order, 0.0)[0]] == fastest


def test_a_difference_below_the_resolution_is_left_to_the_order_and_one_above_is_not() -> None:
    """Two configs 0.04 % apart (Wide-ResNet-tiny's micro-batch 8 and 16 in one profile): the smaller
    micro-batch, whichever the profile put first; 5 % apart: the faster, whatever the order."""
    assert settle([118.62, 118.57], [(8, 2), (16, 2)], 0.01) == (0, [0, 1])
    assert settle([118.57, 118.62], [(8, 2), (16, 2)], 0.01) == (0, [0, 1])
    assert settle([124.5, 118.57], [(8, 2), (16, 2)], 0.01) == (1, [1])
