"""Aceso's search: on the reference's miniset database (when present) it must find configs that fit
memory and are at least as fast as the best Megatron-LM uniform plan; the CLI writes the reference's
files. Every config it returns obeys the reference's legality rules."""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from pathlib import Path

import pytest
from conftest import reproflow

from reproflow.families.aceso.costmodel import CostModel
from reproflow.families.aceso.database import read_database
from reproflow.families.aceso.models import model
from reproflow.families.aceso.plans import best_feasible, config_from_counts, megatron_plans
from reproflow.families.aceso.search import Options, search

MINISET = Path(__file__).resolve().parents[2] / "shared" / "reference-data" / "aceso" / "profiled-time-miniset"
needs_miniset = pytest.mark.skipif(not MINISET.is_dir(), reason=f"the reference's miniset is not at {MINISET}")

# The reference's small settings (1 node x 4 GPUs, 12000 MB).
SMALL = [("gpt", "1_3B", 512, (1, 2, 4, 8)), ("t5", "770M", 512, (1, 2, 4, 8)), ("resnet", "1B", 768, (16, 32, 48, 64))]


@needs_miniset
@pytest.mark.parametrize(("name", "size", "gbs", "mbs"), SMALL)
def test_search_beats_or_matches_the_uniform_plan(name: str, size: str, gbs: int, mbs: tuple[int, ...]) -> None:
    m = model(name, size)
    db = read_database(MINISET, m, list(mbs), m.max_tp(4))
    ops = m.full_op_list(db.ops)
    cost = CostModel(db, 4, 12000)
    uniform = best_feasible(megatron_plans(cost, ops, gbs, 4, m.max_tp(4), range(1, 5)), 12000)
    assert uniform is not None
    results = search(cost, ops, Options(gbs, mbs, 1, 4, 12000, m.max_tp(4), budget_cases=3000), range(1, 5),
                     processes=2)
    found = [r.best for r in results if r.best is not None]
    best = min(found, key=lambda p: p.time)
    assert best.memory <= 12000
    assert best.time <= uniform.prediction.iteration_ms
    for p in found:
        gpus = [s.num_gpus for s in p.config.stages]
        assert sum(gpus) == 4 and set(gpus) <= {1, 2, 4}
        assert [o for s in p.config.stages for o in s.ops] == ops  # every op once, in order
        for s in p.config.stages:
            assert all(t * d == s.num_gpus for t, d in zip(s.tp, s.dp, strict=True))
            assert all(p.config.micro_bs // d in mbs for d in s.dp)


@needs_miniset
def test_search_command_writes_the_reference_outputs(tmp_path: Path) -> None:
    out = tmp_path / "configs"
    argv = ["aceso", "search", "--model-name", "gpt", "--model-size", "1_3B", "--global-batch-size", "512",
            "--micro-batch-size", "1", "2", "4", "8", "--num-nodes", "1", "--num-gpus-per-node", "4",
            "--memory-limit", "12000", "--profiled-time-path", str(MINISET), "--config-save-path",
            f"{out}/", "--max-num-hops", "7", "--time-budget-total", "2", "--config-suffix", "t"]
    # The artifact's database has no optimizer tables: the runtime model, asked for, says which file and what
    # to do; by default the search takes Aceso's own model and says why in its first line.
    refused = reproflow(*argv, "--model", "runtime")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"{MINISET / 'opt_gpt_1_3B_tp1.csv'}: missing; the runtime model of gpt_1_3B" in refused.stderr
    assert "--model reference" in refused.stderr
    proc = reproflow(*argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"performance model: reference (Aceso's own), as {MINISET} has no optimizer tables")
    assert "at least as fast as the uniform plan" in proc.stdout
    # the artifact's budget, asked for: said to be the clock
    assert "budget 2 s per depth (the clock: the config depends on the machine and its load)" in proc.stdout
    assert "Megatron-LM uniform plans, the predicted fastest: pp 4" in proc.stdout
    (top,) = (out / "top_configs").glob("*.json")
    config = json.loads(top.read_text())
    assert config["model_name"] == "gpt" and sum(config["num_ops_in_each_stage"]) == 315
    assert sum(config["num_gpus"]) == 4 and config["global_batch_size"] == 512
    stages = config["num_stages"]
    info = list(csv.reader((out / "csv" / f"info_gpt_1_3B_{stages}stages_t.csv").open()))
    assert info[0] == ["stage-index", "time", "memory(total)", "memory(normal)", "memory(reserved)"]
    assert len(info) == stages + 1
    assert (out / "gpt_1_3B_summary_t.csv").read_text().startswith("search_cost\n")
    predicted = reproflow("aceso", "predict", "--model-name", "gpt", "--model-size", "1_3B", "--global-batch-size",
                          "512", "--num-nodes", "1", "--num-gpus-per-node", "4", "--memory-limit", "12000",
                          "--profiled-time-path", str(MINISET), "--config-save-path", str(out), "--config", str(top))
    assert predicted.returncode == 0, predicted.stderr
    max_time = max(float(row[1]) for row in info[1:])
    assert f"iteration {max_time:.2f} ms" in predicted.stdout


def test_search_command_names_a_missing_database(tmp_path: Path) -> None:
    proc = reproflow("aceso", "megatron", "--model-name", "gpt", "--model-size", "1_3B", "--global-batch-size", "8",
                     "--num-nodes", "1", "--num-gpus-per-node", "2", "--profiled-time-path", str(tmp_path),
                     "--config-save-path", str(tmp_path / "c"))
    assert proc.returncode == 2 and "no profile" in proc.stderr and "Traceback" not in proc.stderr
    bad = reproflow("aceso", "megatron", "--model-name", "gpt", "--model-size", "2B", "--global-batch-size", "8",
                    "--num-nodes", "1", "--num-gpus-per-node", "2", "--profiled-time-path", str(tmp_path),
                    "--config-save-path", str(tmp_path / "c"))
    assert bad.returncode == 2 and "gpt has no size '2B'" in bad.stderr


EUROSYS = MINISET.parent / "profiled-time-eurosys"
PUBLISHED = MINISET.parent / "reference-results"


@pytest.mark.skipif(not EUROSYS.is_dir(), reason=f"the artifact's eurosys database is not at {EUROSYS}")
def test_large_setting_search_step_on_the_artifacts_database(tmp_path: Path) -> None:
    """`aceso reproduce large`: the given single-GPU config, Aceso's search and the artifact's Megatron-LM
    plan per size, the predicted ratio beside the published one; an artifact's search output (here
    reproflow's own, in the same layout) is scored with the reference model beside it."""
    logs = tmp_path / "logs"
    argv = ["aceso", "reproduce", "large", "--profiled-time-path", str(EUROSYS), "--models", "gpt",
            "--model-sizes", "350M", "1_3B", "--budget-cases", "2000", "--log-path", str(logs),
            "--published", str(PUBLISHED)]
    run = reproflow(*argv)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()
            if line.startswith(("350M", "1_3B")) and len(line.split()) == 9}
    assert rows["350M"][1:5] == ["200.71", "200.71", "1.00", "1.00"]  # the artifact predicts 200.71 s for it too
    assert rows["1_3B"][1] == "126.04" and float(rows["1_3B"][3]) >= 1.0 and rows["1_3B"][4] == "1.22"
    assert (logs / "results" / "predicted_large_gpt.csv").is_file()
    assert (logs / "results" / "fig7_predicted_large.png").is_file()
    scored = reproflow(*argv, "--artifact-configs", str(logs / "aceso" / "search"))
    assert scored.returncode == 0 and "reused: this database" in scored.stdout
    row = next(line.split() for line in scored.stdout.splitlines() if line.startswith("1_3B") and
               len(line.split()) == 9)
    assert row[5] == row[2] and row[6] == row[3]  # the same configs score the same
    bad = reproflow(*argv[:-6], "--model-sizes", "1_5B")
    assert bad.returncode == 2 and "--model-sizes 1_5B: not in the large setting" in bad.stderr


@needs_miniset
def test_op_level_tuning_keeps_stages_legal() -> None:
    """--finetune-after-trial (the artifact's Wide-ResNet setting): tp/dp traded over runs of ops and
    algos switched per op; every stage it returns keeps tp x dp = its GPUs and profiled micro-batches."""
    from reproflow.families.aceso.search import DepthSearch

    m = model("resnet", "1B")
    mbs = (16, 32, 48, 64)
    db = read_database(MINISET, m, list(mbs), 4)
    cost = CostModel(db, 4, 12000)
    s = DepthSearch(cost, m.full_op_list(db.ops), Options(768, mbs, 1, 4, 12000, 4, budget_s=30,
                                                          finetune_after_trial=1), 1)
    s.start = time.monotonic()
    ops = m.full_op_list(db.ops)
    n = len(ops)
    config = config_from_counts(m, 768, 64, ops, [n], [2] * n, [2] * n, [0] * n, [0] * n)
    s.recompute(config, 0)
    stage = config.stages[0]
    for tuned in (s._tune_dims(stage, config.micro_bs, 0), s._tune_algos(stage, config.micro_bs, 0)):
        assert tuned is not None
        assert all(t * d == stage.num_gpus and config.micro_bs // d in mbs for t, d in zip(tuned.tp, tuned.dp,
                                                                                           strict=True))
    p = s.evaluate(config)
    assert s.finetune(p).time <= p.time


@pytest.mark.parametrize("shape", ["linear", "steps", "convex", "concave"])
def test_fewest_ops_equals_a_scan_where_moving_ops_never_hurts(shape: str) -> None:
    """The bracketing search for how many boundary ops to move returns what the reference's scan
    0, 1, 2, ... returns, for every goal, on stages whose time falls as ops leave (any curve)."""
    from reproflow.families.aceso.costmodel import Stage
    from reproflow.families.aceso.search import DepthSearch

    n = 300
    curve = {"linear": lambda k: 1000.0 - 3 * k, "steps": lambda k: 1000.0 - 40 * (k // 13),
             "convex": lambda k: (n - k) ** 2 / 90, "concave": lambda k: 1000.0 - k ** 2 / 90}[shape]
    s = DepthSearch.__new__(DepthSearch)
    s.opts = Options(8, (1,), 1, 2, 1000, 2, op_group_size=1)
    config = type("C", (), {"stages": [Stage(["op"] * n, [1] * n, [1] * n, [0] * n, [0] * n)]})()
    probes: list[int] = []
    s.value_after = lambda _c, _b, _p, moved, _m: probes.append(moved) or curve(moved)
    for goal in [curve(k) + d for k in range(0, n, 7) for d in (-0.5, 0.0, 0.5)] + [curve(n - 1) - 1, 1e9]:
        scan = next((k for k in range(n) if curve(k) < goal), None)
        probes.clear()
        assert s._fewest_ops(config, 0, 1, goal, "time") == scan, goal
        assert len(probes) <= 2 * n.bit_length() + 2  # never worse than a bisection by more than twice


@needs_miniset
def test_a_count_budget_finds_one_config_however_slow_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default budget counts explored cases, so the config does not depend on the clock: with one that
    runs 1000 s a reading (a machine as slow or as loaded as any) the search explores the same cases and
    finds the same config, depth by depth; the artifact's clock budget stops at once on it."""
    from reproflow.families.aceso import search as search_module

    m = model("gpt", "1_3B")
    mbs = (1, 2, 4, 8)
    db = read_database(MINISET, m, list(mbs), m.max_tp(4))
    cost, ops = CostModel(db, 4, 12000), m.full_op_list(db.ops)
    opts = Options(512, mbs, 1, 4, 12000, m.max_tp(4), budget_cases=400)

    def found(budget: Options) -> list[tuple[int, int, tuple | None]]:
        return [(r.num_stages, r.explored, r.best.key() if r.best else None)
                for r in search(cost, ops, budget, range(1, 4), processes=1)]

    idle = found(opts)
    assert all(explored >= 400 * 0.9 for _, explored, _ in idle[1:]) and all(k for _, _, k in idle)
    ticks = iter(range(0, 10 ** 9, 1000))
    monkeypatch.setattr(search_module, "clock", lambda: float(next(ticks)))
    assert found(opts) == idle
    clocked = found(dataclasses.replace(opts, budget_s=200.0))
    assert clocked != idle and all(explored < 400 * 0.9 for _, explored, _ in clocked)


def test_a_count_budget_searches_a_depth_a_core_and_the_clock_every_depth_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the count, depths past the cores add no speed and hold their explored configs (several GB at a
    thousand layers), so the default runs one a core; on the clock each depth's budget starts with the
    search, so every depth runs at once, as the reference runs them."""
    from reproflow.families.aceso.search import parallel

    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1})
    count, clock = Options(64, (1,), 1, 8, 1000, 1), Options(64, (1,), 1, 8, 1000, 1, budget_s=10.0)
    assert [parallel(count, n) for n in (1, 2, 8)] == [1, 2, 2]
    assert [parallel(clock, n) for n in (1, 2, 8)] == [1, 2, 8]
