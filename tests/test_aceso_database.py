"""A profile in rounds: the suite takes its turns over the micro-batches, the database takes each op's
median over the rounds of the newest suite, so one slow spell of the machine moves no op, and keeps each
round's files, by which the search's near-tie rule leaves to a fixed order what the rounds cannot tell."""

from __future__ import annotations

import csv
import random
import statistics
import tempfile
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reproflow.families.aceso.database import FIELDS, ROUNDS_DIR, write_from_rows
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
        # each round's own values beside the medians; a profile in one round leaves no round files behind
        own = [list(csv.reader((Path(tmp) / ROUNDS_DIR / str(i + 1) / "gpt_tiny_mbs2_tp1_algo0.csv").open()))
               for i in range(len(speeds))]
        write_from_rows(pd.DataFrame(_rows("aceso-profile-gpt_tiny", "2027-01-01T00:00:00", 0, 1.0)), Path(tmp))
        assert not (Path(tmp) / ROUNDS_DIR).exists()
    median = statistics.median(speeds)
    for row in table[1:]:
        for k, value in enumerate(row[1:]):
            assert float(value) == pytest.approx(median * (k + 1), rel=1e-3, abs=1e-3)
    for speed, rows_of_round in zip(speeds, own, strict=True):
        assert [float(v) for v in rows_of_round[1][1:]] == pytest.approx([speed * (k + 1) for k in range(len(FIELDS))],
                                                                         rel=1e-3, abs=1e-3)


def test_a_profile_in_rounds_takes_its_turns_over_the_micro_batches() -> None:
    """Round-major: every micro-batch and algo once per round, each round with its share of the repeats
    (rounded up) and of the seconds; one round is the reference's suite."""
    suite = tomllib.loads(profile_suite("gpt", "tiny", [1, 2], [1], 64, 2, 10, "0-4", rounds=3, repeat_seconds=2.0))
    ops = suite["experiment"][0]
    assert ops["matrix"] == {"round": [1, 2, 3], "mbs": [1, 2], "algo": [0, 1]}
    assert ops["params"]["repeats"] == 4 and ops["params"]["repeat_seconds"] == 2.0 / 3
    once = tomllib.loads(profile_suite("gpt", "tiny", [1, 2], [1], 64, 2, 10, "0-4"))["experiment"][0]
    assert "round" not in once["matrix"] and once["params"]["repeats"] == 10 and "repeat_seconds" not in once["params"]


candidates = st.integers(1, 6).flatmap(lambda n: st.integers(2, 7).flatmap(lambda r: st.tuples(
    st.lists(st.floats(1.0, 100.0), min_size=n, max_size=n),
    st.lists(st.lists(st.floats(1.0, 100.0), min_size=r, max_size=r), min_size=n, max_size=n),
    st.permutations(range(n)))))


@settings(max_examples=300, deadline=None)
@given(candidates, st.floats(0.2, 5.0))
def test_the_near_tie_rule_depends_on_the_rounds_not_on_the_machines_speed(case: tuple, speed: float) -> None:
    """The kept candidate is the first by the fixed order among those not slower than the fastest in every
    round; a candidate slower in every round is never kept; the pick does not move when the machine is
    uniformly faster or slower, nor with the order the candidates are listed in."""
    times, rounds, order = case
    kept, tied = settle(times, rounds, order)
    fastest = min(range(len(times)), key=lambda i: (times[i], order[i]))
    told = [i for i in range(len(times))
            if i != fastest and all(f < t for f, t in zip(rounds[fastest], rounds[i], strict=True))]
    assert sorted(tied) == sorted(set(range(len(times))) - set(told))
    assert kept == min(tied, key=lambda i: order[i]) and kept not in told
    assert settle([t * speed for t in times], [[t * speed for t in r] for r in rounds], order)[0] == kept
    shuffled = list(reversed(range(len(times))))
    again, _ = settle([times[i] for i in shuffled], [rounds[i] for i in shuffled], [order[i] for i in shuffled])
    assert shuffled[again] == kept


def test_without_rounds_the_fastest_is_kept() -> None:
    """A profile in one round (the artifact's databases): the predicted fastest stands, as in the reference."""
    assert settle([3.0, 2.0, 2.5], [[3.0], [2.0], [2.5]], [(1,), (8,), (2,)]) == (1, [1])


def test_the_near_tie_rule_tells_equal_configs_apart_at_its_stated_rate() -> None:
    """Two configs equally fast (each round's times from one distribution): either is faster in every round
    with probability 2^-R, so they are told apart in 2^(1-R) of profiles (6.25 % at 5 rounds) and the rule
    keeps the config first in the fixed order in the rest; one faster by far more than the rounds' spread
    is told apart in every profile."""
    rng = random.Random(76)
    apart = 0
    trials = 4000
    for _ in range(trials):
        rounds = [[rng.gauss(100, 5) for _ in range(5)] for _ in range(2)]
        times = [statistics.median(r) for r in rounds]
        _, tied = settle(times, rounds, [(4,), (8,)])
        apart += len(tied) == 1
    assert 0.045 < apart / trials < 0.08
    rounds = [[rng.gauss(100, 5) for _ in range(5)], [rng.gauss(70, 5) for _ in range(5)]]
    assert settle([statistics.median(r) for r in rounds], rounds, [(4,), (8,)]) == (1, [1])
