"""Aceso's search: on the reference's miniset database (when present) it must find configs that fit
memory and are at least as fast as the best Megatron-LM uniform plan; the CLI writes the reference's
files. Every config it returns obeys the reference's legality rules."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import reproflow

from reproflow.families.aceso.costmodel import CostModel
from reproflow.families.aceso.database import read_database
from reproflow.families.aceso.models import model
from reproflow.families.aceso.plans import best_feasible, megatron_plans
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
    results = search(cost, ops, Options(gbs, mbs, 1, 4, 12000, m.max_tp(4), budget_s=2.0), range(1, 5), processes=2)
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
    # The artifact's database has no optimizer tables: the default (runtime) model says which file and what to do.
    refused = reproflow(*argv)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"{MINISET / 'opt_gpt_1_3B_tp1.csv'}: missing; the runtime model of gpt_1_3B" in refused.stderr
    assert "--model reference" in refused.stderr
    proc = reproflow(*argv, "--model", "reference")
    assert proc.returncode == 0, proc.stderr
    assert "at least as fast as the uniform plan" in proc.stdout and "Megatron-LM uniform plan: pp 4" in proc.stdout
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
                          "--profiled-time-path", str(MINISET), "--config-save-path", str(out), "--config", str(top),
                          "--model", "reference")
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
