"""Both sides screened alike, and each side's picks trained in turns.

A search with `megatron_grid` writes every Megatron-LM plan worth training beside its configs
(pipeline._write_grid): uniform and uneven first and last stages, every micro-batch, full
recomputation where a plan does not fit without it; Aceso's search writes its best config of each
pipeline depth. Then, each step one job on the same ranks:

1. screen: each plan of the grid and each of Aceso's configs trained once, in an order shuffled by a
   seed of the search's options, each point's place recorded in its rows (`turn`);
2. select: on each side, the fastest measured config whose measured peak memory fits the limit is its
   measured pick (`baseline.json` beside the configs, with every config's prediction and measurement);
3. confirm: each side's measured pick and its predicted pick (the artifact's: Aceso's predicted best,
   the uniform plan its cost model predicts fastest) in rounds, the order turned round every round,
   each training's round, pick and place in the rows.

The claims are judged on the confirmation alone: the screen chose the picks, and its figures favour
whichever config happened to run fast there (the winner's curse); the rounds are new data.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from reproflow.families.aceso.manifest import BASELINE, newest_manifest, predicted
from reproflow.families.aceso.plans import read_config
from reproflow.spec.errors import ReproflowError
from reproflow.spec.family import AGGREGATE
from reproflow.spec.suite import suite_toml
from reproflow.store.files import atomic_write

# Each plan of the screen: 1 untimed iteration, then 3 timed (their median ranks it), then the one that
# measures its memory (and its op timers). One is enough on CPUs: in three make demo runs' 210 trainings
# the first iteration took a median 1.04-1.06x the third onwards' (up to 1.8x), the second 0.98-1.01x.
SCREEN = {"train_iters": 4, "train_seconds": 0.0, "warmup_iters": 1}


def order_seed(options: dict[str, object]) -> int:
    """The screen's shuffle seed: the same for the same search options (a rerun reuses the points
    measured), another for another search."""
    return int(hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:8], 16)


def turns_suite(name: str, description: str, folder: Path, trainings: Sequence[dict[str, object]], nodes: int,
                gpus_per_node: int, params: dict[str, object], network: str = "") -> str:
    """One job training configs in the given order: each training a point whose `config` (default: the
    search folder), `plan`, `grid_plan`, `pick`, `round` and `tp_impl` come from `trainings`, its place (1, 2, ...)
    its `turn`."""
    default = {"config": str(folder.resolve()), "grid_plan": "", "pick": "measured", "round": 0,
               "tp_impl": "reproflow"}
    zipped = {k: [str(t[k]) if isinstance(t.get(k), Path) else t.get(k, default.get(k)) for t in trainings]
              for k in ("config", "plan", "grid_plan", "pick", "round", "tp_impl")}
    zipped["turn"] = list(range(1, len(trainings) + 1))
    return suite_toml({"description": f"Aceso runtime: {description}"},
                      {"nodes": nodes, "time_limit": "02:00:00", "network": network},
                      [{"name": "trainings", "family": "aceso", "launch": {"procs_per_node": gpus_per_node},
                        "params": {"kind": "train", **params}, "zip": zipped}])


def screen_trainings(grid: Sequence[str], aceso: Sequence[dict[str, object]], seed: int) -> list[dict[str, object]]:
    """Every plan of the grid and every config of Aceso's search (`aceso`: each one's training fields, its
    JSON or its pipeline depth), once each, shuffled: both sides screened alike."""
    trainings: list[dict[str, object]] = [{"plan": "megatron", "grid_plan": g} for g in grid]
    trainings += [{"plan": "aceso", **a} for a in aceso]
    random.Random(seed).shuffle(trainings)
    return trainings


# What a confirmation's trainings stand for: (plan, pick). The strongest comparison is the measured picks'
# (each side's fastest on the screen that fits), the paper's the predicted picks' (as the artifact picks).
ROLES = (("aceso", "measured"), ("megatron", "measured"), ("aceso", "predicted"), ("megatron", "predicted"))


def confirm_trainings(rounds: int, mcore: bool, configs: dict[tuple[str, str], Path] | None = None
                      ) -> list[dict[str, object]]:
    """Each side's measured and predicted picks (ROLES) in rounds, the order turned round every round
    (ABBA for two); a pick that is the other pick's config trains once, as both (`pick` both). The
    measured Megatron-LM plan on megatron-core's layers first where asked (not part of a round).
    `configs`: each role's JSON (None: the search folder's, resolved when the job runs, each role
    trained)."""
    at = {role: {"config": path} for role, path in (configs or {}).items()}
    same = {plan for plan in ("aceso", "megatron") if configs and read_config(configs[(plan, "measured")])
            == read_config(configs[(plan, "predicted")])}
    roles = [(plan, "both" if plan in same else pick) for plan, pick in ROLES
             if not (plan in same and pick == "predicted")]
    out: list[dict[str, object]] = [{"plan": "megatron", "pick": "measured", "tp_impl": "megatron-core",
                                     **at.get(("megatron", "measured"), {})}] if mcore else []
    for r in range(1, rounds + 1):
        for plan, pick in roles if r % 2 else roles[::-1]:
            out.append({"plan": plan, "pick": pick, "round": r,
                        **at.get((plan, "measured" if pick == "both" else pick), {})})
    return out


def select(rows: pd.DataFrame, folder: Path, suite: str) -> dict[str, object]:
    """The screen's configs measured (median iteration, peak memory of the heaviest rank) beside their
    predictions; on each side, the fastest whose peak fits the limit is its measured pick: the
    Megatron-LM baseline, and Aceso's config of the confirmation. Written to baseline.json."""
    manifest = newest_manifest(folder)
    if manifest is None:
        raise ReproflowError(f"{folder}: no search manifest; run the search first.")
    done = json.loads(manifest.read_text())
    limit = float(done.get("megatron_memory_limit") or done["memory_limit"])
    grid = {g["name"] for g in done.get("megatron_grid") or ()}
    mine = {str(n) for n in done.get("configs") or ()}
    names = rows["config_name"].astype(str) + ".json"
    # This search's points only: a suite run again after another search keeps the other's files.
    ours = ((rows["plan"].astype(str) == "megatron") & names.isin(grid)) | (
        (rows["plan"].astype(str) == "aceso") & names.isin(mine))
    rows = rows.assign(name=names)
    picked = rows[(rows["suite"].astype(str) == suite) & ours & (rows["metric"].isin(["iteration_ms",
                                                                                        "rank_max_reserved"]))]
    if picked.empty:
        raise ReproflowError(f"no rows of the screen {suite}: it did not run, or its points failed.")
    kept = picked[(picked["metric"] == "rank_max_reserved") | (picked["rank"].astype(str) == str(AGGREGATE))]
    measured = kept.pivot_table(index=["plan", "name", "turn"], columns="metric", values="value",
                                aggfunc="max").reset_index()
    described = {g["name"]: g.get("plan", "") for g in done.get("megatron_grid") or ()}
    plans = []
    for r in measured.itertuples():
        ms, mb = predicted(folder / str(r.name))
        plans.append({"name": r.name, "plan": r.plan, "turn": int(r.turn), "describe": described.get(r.name, ""),
                      "predicted_ms": ms, "predicted_mb": mb, "measured_ms": round(float(r.iteration_ms), 2),
                      "measured_mb": round(float(r.rank_max_reserved), 2),
                      "fits": bool(r.rank_max_reserved <= limit)})
    best = {}
    for side in ("megatron", "aceso"):
        fitting = [p for p in plans if p["plan"] == side and p["fits"]]
        best[side] = min(fitting, key=lambda p: p["measured_ms"])["name"] if fitting else None  # type: ignore[arg-type, return-value]
    if best["megatron"] is None:
        raise ReproflowError(f"the screen {suite}: no Megatron-LM plan measured within {limit:.0f} MB.")
    aceso = best["aceso"] or done["configs"][0]  # none of Aceso's fits: its predicted pick stands
    out = {"search": manifest.name, "screen": suite, "memory_limit": limit, "measured_best": best["megatron"],
           "predicted_best": done.get("megatron"), "aceso_measured_best": best["aceso"],
           "aceso": done["configs"][0],
           "same_as_aceso": read_config(folder / str(best["megatron"])) == read_config(folder / str(aceso)),
           "plans": sorted(plans, key=lambda p: p["measured_ms"]), "written": time.time()}  # type: ignore[arg-type, return-value]
    atomic_write(folder / BASELINE, json.dumps(out, indent=2) + "\n")
    return out


def select_job(results: Path, folder: Path, suite: str) -> str:
    """Body of a submitted selection (after the screen's job): baseline.json from the screen's rows."""
    from reproflow.reporting.report import load_results

    return str(select(load_results(results), folder, suite)["measured_best"])


def say(chosen: dict[str, object]) -> str:
    """The selection in lines: every plan screened, fastest first, and the one taken."""
    lines = [f"the Megatron-LM plans and Aceso's configs trained ({chosen['screen']}), fastest first; memory limit "
             f"{chosen['memory_limit']:.0f} MB per rank:"]
    for p in chosen["plans"]:  # type: ignore[attr-defined]
        pred = "".join(f", predicted {p[k]:.{d}f} {unit}" if k == "predicted_ms" else f" {p[k]:.{d}f} {unit}"
                       for k, d, unit in (("predicted_ms", 1, "ms"), ("predicted_mb", 0, "MB")) if p[k] is not None)
        over = "" if p["fits"] else " (over the limit)"
        lines.append(f"  {p['measured_ms']:8.1f} ms {p['measured_mb']:6.1f} MB{over}  "
                     f"{p['describe'] or 'Aceso: ' + p['name']}{pred}")
    lines.append(f"the baseline: {chosen['measured_best']} (measured fastest that fits; predicted fastest: "
                 f"{chosen['predicted_best']})" + ("; it is Aceso's config itself" if chosen["same_as_aceso"] else ""))
    lines.append(f"Aceso's config: {chosen.get('aceso_measured_best') or 'none fits; ' + str(chosen['aceso'])} "
                 f"(measured fastest that fits; predicted fastest: {chosen['aceso']})")
    return "\n".join(lines)
