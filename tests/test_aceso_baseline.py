"""The Megatron-LM baseline as measured: the grid of plans (uneven first and last stages, recomputation
only where a plan needs it), the memory limit where recomputation pays, the screen's shuffled order, the
ABBA rounds, and the choice of the fastest measured plan that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from reproflow.families.aceso import baseline
from reproflow.families.aceso.costmodel import Prediction, StageMemory
from reproflow.families.aceso.layout import model_ops
from reproflow.families.aceso.manifest import resolve_config
from reproflow.families.aceso.models import model
from reproflow.families.aceso.plans import (
    Plan,
    config_from_counts,
    layer_splits,
    plan_name,
    pressure_limit,
    shapes,
    to_train,
    write_json,
)
from reproflow.spec.errors import NotApplicable


def test_layer_splits_have_megatrons_first_and_last_stages() -> None:
    assert layer_splits(4, 1, True) == [(4,)]
    assert layer_splits(4, 2, False) == [(2, 2)]
    assert layer_splits(4, 2, True) == [(1, 3), (2, 2), (3, 1)]
    # between the first and the last, equal stages of one layer or more
    assert layer_splits(8, 4, True) == [(1, 3, 3, 1), (1, 2, 2, 3), (1, 1, 1, 5), (2, 2, 2, 2), (2, 1, 1, 4),
                                        (3, 2, 2, 1), (3, 1, 1, 3), (4, 1, 1, 2), (5, 1, 1, 1)]
    assert layer_splits(5, 2, False) == []  # no equal split: only the uneven ones
    assert (2, 3) in layer_splits(5, 2, True)


def test_the_grid_of_gpt_tiny_on_two_hosts() -> None:
    gpt = model("gpt", "tiny")
    grid = shapes(gpt, [1, 2, 4, 8], 2, 1, range(1, 3), uneven=True)
    # data parallelism (micro-batch 2, 4, 8 split over 2) and a 2-stage pipeline (3 splits x 4 micro-batches),
    # each with full recomputation or none
    assert len(grid) == (3 + 3 * 4) * 2
    for pp, tp, dp, _, _, layers, counts in grid:
        assert pp * tp * dp == 2 and sum(layers) == gpt.num_layers and sum(counts) == 55
    uniform = shapes(gpt, [1, 2, 4, 8], 2, 1, range(1, 3))
    assert {s[5] for s in uniform} == {(4,), (2, 2)}
    assert plan_name(2, 1, 1, 4, (3, 1), False) == "megatron_pp2_tp1_dp1_mbs4_layers3-1_norecompute.json"


def _plan(ms: float, mb: float, recompute: bool, mbs: int = 4, layers: tuple[int, ...] = (2, 2)) -> Plan:
    memory = StageMemory(mb, 0.0, 0.0, 0.0, 0.0, 0.0)
    return Plan(2, 1, 1, mbs, recompute, None, Prediction([ms], [ms], [memory]), layers)  # type: ignore[arg-type]


def test_recomputation_is_trained_only_where_the_plan_needs_it() -> None:
    plans = [_plan(100, 90, False), _plan(120, 60, True), _plan(130, 80, False, mbs=2), _plan(150, 50, True, mbs=2)]
    assert to_train(plans, 1000) == [plans[0], plans[2]]
    # under 85 MB the micro-batch-4 plan fits only with recomputation; micro-batch 2 fits without
    assert to_train(plans, 85) == [plans[1], plans[2]]


def test_under_the_memory_pressure_limit_every_plan_recomputes() -> None:
    plans = [_plan(100, 90, False), _plan(120, 60, True), _plan(130, 80, False, mbs=2), _plan(150, 50, True, mbs=2)]
    limit = pressure_limit(plans)
    # the least any plan needs without recomputation: none fits without it, both recomputing plans fit
    assert limit == 80
    assert [p for p in plans if p.prediction.max_memory < limit] == [plans[1], plans[3]]
    # the same limit whatever the plans' times: it depends on memory alone
    assert pressure_limit([_plan(999, 90, False), _plan(1, 60, True), _plan(5, 80, False), _plan(7, 50, True)]) == 80
    assert pressure_limit([_plan(100, 90, False), _plan(120, 95, True)]) is None


def test_confirmation_rounds_turn_the_order_round_and_train_a_config_once(tmp_path: Path) -> None:
    """Each side's measured and predicted picks in rounds, the order reversed every other round, so each
    role is as often early as late; a pick that is the other pick's config trains once, as both."""
    for name, counts in (("a", [27, 28]), ("a2", [40, 15]), ("m", [20, 35]), ("u", [30, 25])):
        _write(tmp_path / f"{name}.json", counts, 4)
    configs = {("aceso", "measured"): tmp_path / "a.json", ("aceso", "predicted"): tmp_path / "a2.json",
               ("megatron", "measured"): tmp_path / "m.json", ("megatron", "predicted"): tmp_path / "u.json"}
    turns = baseline.confirm_trainings(2, mcore=True, configs=configs)
    assert turns[0] == {"plan": "megatron", "pick": "measured", "tp_impl": "megatron-core",
                        "config": tmp_path / "m.json"}
    order = [(t["round"], t["plan"], t["pick"]) for t in turns[1:]]
    assert order == [(1, "aceso", "measured"), (1, "megatron", "measured"), (1, "aceso", "predicted"),
                     (1, "megatron", "predicted"), (2, "megatron", "predicted"), (2, "aceso", "predicted"),
                     (2, "megatron", "measured"), (2, "aceso", "measured")]
    assert turns[3]["config"] == tmp_path / "a2.json"
    same = {**configs, ("megatron", "predicted"): tmp_path / "m.json"}  # the predicted plan measured fastest
    turns = baseline.confirm_trainings(2, mcore=False, configs=same)
    assert [(t["round"], t["plan"], t["pick"]) for t in turns] == [
        (1, "aceso", "measured"), (1, "megatron", "both"), (1, "aceso", "predicted"),
        (2, "aceso", "predicted"), (2, "megatron", "both"), (2, "aceso", "measured")]
    submitted = baseline.confirm_trainings(1, mcore=False)  # resolved when the job runs: every role trains
    assert [(t["plan"], t["pick"]) for t in submitted] == list(baseline.ROLES)


def test_the_screen_is_shuffled_by_its_seed_and_recorded(tmp_path: Path) -> None:
    grid = [f"megatron_{i}.json" for i in range(12)]
    aceso = [{"grid_plan": f"{k}stages"} for k in (1, 2)]
    one = baseline.screen_trainings(grid, aceso, 1)
    assert baseline.screen_trainings(grid, aceso, 1) == one  # a rerun of the same search: the same points
    assert baseline.screen_trainings(grid, aceso, 2) != one
    assert sorted(str(t.get("grid_plan", "")) for t in one) == sorted(["1stages", "2stages", *grid])
    assert [t.get("grid_plan") for t in one if t["plan"] == "megatron"] != grid  # not in the grid's order
    text = baseline.turns_suite("s", "d", tmp_path, one, 2, 1, {"train_iters": 5})
    assert "turn = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]" in text


def _write(path: Path, counts: list[int], mbs: int) -> None:
    gpt = model("gpt", "tiny")
    ops = [o.name for o in model_ops("gpt", "tiny", None, mbs, [0] * 55, 64)]
    n = len(ops)
    write_json(config_from_counts(gpt, 32, mbs, ops, counts, [1] * n, [1] * n, [0] * n, [0] * n), path)


def _rows(suite: str, measured: dict[tuple[str, str, str], tuple[float, float]]) -> pd.DataFrame:
    rows = []
    for turn, ((plan, grid_plan, name), (ms, mb)) in enumerate(measured.items(), 1):
        common = {"suite": suite, "plan": plan, "grid_plan": grid_plan or float("nan"), "turn": turn,
                  "config_name": name}
        rows.append({**common, "metric": "iteration_ms", "value": ms, "rank": "all"})
        rows += [{**common, "metric": "rank_max_reserved", "value": mb * f, "rank": r} for r, f in ((0, 1), (1, .5))]
    return pd.DataFrame(rows)


def test_the_fastest_measured_plan_that_fits_is_the_baseline(tmp_path: Path) -> None:
    fast, fits, predicted = ("megatron_pp2_tp1_dp1_mbs4_layers3-1_norecompute.json",
                             "megatron_pp2_tp1_dp1_mbs4_layers2-2_norecompute.json",
                             "megatron_pp2_tp1_dp1_mbs2_layers2-2_norecompute.json")
    _write(tmp_path / fast, [40, 15], 4)
    _write(tmp_path / fits, [27, 28], 4)
    _write(tmp_path / predicted, [27, 28], 2)
    _write(tmp_path / "gpt_tiny_2stages_x.json", [40, 15], 4)
    _write(tmp_path / "gpt_tiny_1stages_x.json", [55], 4)
    grid = [{"name": n, "plan": n, "predicted_ms": 1.0, "predicted_mb": 1.0} for n in (fast, fits, predicted)]
    (tmp_path / "search-k.json").write_text(json.dumps({
        "configs": ["gpt_tiny_2stages_x.json", "gpt_tiny_1stages_x.json"], "megatron": predicted,
        "megatron_grid": grid, "memory_limit": 100.0, "megatron_memory_limit": 100.0, "best_ms": 1.0,
        "depths": [{"num_stages": 1, "ms": 3.0}, {"num_stages": 2, "ms": 2.0}]}))
    rows = _rows("screen", {("megatron", fast, fast[:-5]): (800.0, 120.0), ("megatron", fits, fits[:-5]): (900.0, 90.0),
                            ("megatron", predicted, predicted[:-5]): (950.0, 70.0),
                            ("aceso", "2stages", "gpt_tiny_2stages_x"): (810.0, 110.0),
                            ("aceso", "1stages", "gpt_tiny_1stages_x"): (850.0, 80.0)})
    # another search's Aceso config in the same suite's folder is not this one's
    rows = pd.concat([rows, _rows("screen", {("aceso", "", "gpt_tiny_2stages_old"): (10.0, 1.0)})])
    chosen = baseline.select(rows, tmp_path, "screen")
    # on each side the fastest measured over the limit (120 and 110 MB) is not the pick; the next one is
    assert chosen["measured_best"] == fits and chosen["predicted_best"] == predicted
    assert chosen["aceso_measured_best"] == "gpt_tiny_1stages_x.json" and chosen["aceso"] == "gpt_tiny_2stages_x.json"
    assert [p["name"] for p in chosen["plans"]] == [fast, "gpt_tiny_2stages_x.json", "gpt_tiny_1stages_x.json",
                                                    fits, predicted]
    assert [p["predicted_ms"] for p in chosen["plans"]][1:3] == [2.0, 3.0]
    assert not chosen["same_as_aceso"]
    assert resolve_config(tmp_path, "megatron") == tmp_path / fits
    assert resolve_config(tmp_path, "megatron", pick="predicted") == tmp_path / predicted
    assert resolve_config(tmp_path, "megatron", predicted) == tmp_path / predicted
    assert resolve_config(tmp_path, "aceso") == tmp_path / "gpt_tiny_1stages_x.json"
    assert resolve_config(tmp_path, "aceso", pick="predicted") == tmp_path / "gpt_tiny_2stages_x.json"
    assert resolve_config(tmp_path, "aceso", "2stages") == tmp_path / "gpt_tiny_2stages_x.json"
    with pytest.raises(NotApplicable, match="no config of 3stages"):
        resolve_config(tmp_path, "aceso", "3stages")
    with pytest.raises(NotApplicable, match="not among the plans"):
        resolve_config(tmp_path, "megatron", "megatron_pp1_tp1_dp2_mbs8_layers4_recompute.json")
    assert "the baseline: " + fits in baseline.say(chosen)
