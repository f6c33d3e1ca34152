"""`make bench`: the run catalog at the size of a year of nightly runs.

Generates 365 results folders (one a night) of 274 points each, 100,010 point files in all, written by
the result writer (param_comms rows: busBW and time at two message sizes, 5 repeats, a run id and a
manifest each), lists their folders in a catalog of their own, then times each command in a process of
its own and reads its peak memory (the child's maximum resident set):

1. `reproflow runs`, the index built from nothing;
2. `reproflow runs` again, nothing new (the files stat-ed, none read);
3. one more night written, then `reproflow runs` (only its files read);
4. `reproflow compare` of the first night and the last, by run id;
5. the same two nights given as results folders.

-> <out>/catalog.csv (step, points in the catalog, points compared, seconds, peak MiB).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from reproflow.spec.family import Measurement
from reproflow.store.files import append_line, atomic_write
from reproflow.store.provenance import Provenance
from reproflow.store.results import make_rows, point_path, rows_to_csv
from reproflow.store.runs import manifest_path

NIGHTS, POINTS = 365, 274
SIZES = (1 << 20, 1 << 26)


def write_night(root: Path, night: int, rng: np.random.Generator) -> tuple[str, Path]:
    """One night's results folder: POINTS points and the run's manifest; returns (run id, folder)."""
    day = _dt.date(2025, 11, 26) + _dt.timedelta(days=night)
    run_id = f"{day:%Y%m%d}-020000-{night:06x}"
    results = root / f"{day}" / "results"
    prov = Provenance(f"{1000 + night}", "node1,node2", 16, "nccl", "cuda", "NVIDIA H100 80GB HBM3", "2.13.0",
                      "2.28.9", f"{night:040x}", "", "", run_id=run_id)
    for point in range(POINTS):
        collective = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")[point % 4]
        measured = []
        for size in SIZES:
            noise = np.exp(rng.normal(0.0, 0.03, 5))
            measured += [(r, m) for r, n in enumerate(noise) for m in (
                Measurement("busbw", 300.0 * n, "GB/s", {"size_bytes": size}),
                Measurement("time_us", size / 3e5 / n, "us", {"size_bytes": size}))]
        key = f"collective={collective},group={point}"
        rows = make_rows({"suite": "nightly", "experiment": "comms", "family": "param_comms", "point": key},
                         {"collective": collective, "iters": point}, measured, prov)
        atomic_write(point_path(results, "nightly", "comms", key), rows_to_csv(rows))
    manifest = {"run_id": run_id, "command": ["reproflow", "submit", "nightly"], "results": str(results),
                "suites": ["nightly"], "executor": "slurm", "cluster": "bench", "nodes": 2,
                "start": f"{day}T02:00:00+00:00", "end": f"{day}T02:40:00+00:00", "state": "completed",
                "exit_code": 0}
    atomic_write(manifest_path(results, run_id), json.dumps(manifest) + "\n")
    return run_id, results


def timed(args: list[str], env: dict[str, str], log: Path) -> tuple[float, float, str]:
    """Seconds and peak MiB of one reproflow command in a process of its own, and its last line."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "reproflow.app.cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    text = log.read_text()
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"bench: reproflow {' '.join(args)} failed:\n{text[-3000:]}")
    return seconds, usage.ru_maxrss / 1024, (text.strip().splitlines() or [""])[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="folder for catalog.csv")
    parser.add_argument("--work", default="", help="where the generated folders go (default: a temporary folder)")
    parser.add_argument("--nights", type=int, default=NIGHTS, help="results folders to generate")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="reproflow-catalog-bench-"))
    catalog = work / "catalog"
    env = dict(os.environ, REPROFLOW_CATALOG=str(catalog))
    env.pop("REPROFLOW_RUN_ID", None)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    nights = [write_night(work, n, rng) for n in range(args.nights)]
    for _, results in nights:
        append_line(catalog / "folders.txt", str(results.resolve()))
    generated = time.perf_counter() - start
    total = args.nights * POINTS
    print(f"bench: {total} points in {args.nights} folders written in {generated:.0f} s under {work}")
    rows = [{"step": "generate the folders (not reproflow)", "catalog_points": total, "compared_points": 0,
             "seconds": generated, "peak_mib": np.nan}]

    def step(name: str, command: list[str], compared: int = 0) -> None:
        seconds, peak, last = timed(command, env, work / "command.log")
        rows.append({"step": name, "catalog_points": total, "compared_points": compared, "seconds": seconds,
                     "peak_mib": peak})
        print(f"bench: {name}: {seconds:.1f} s, {peak:.0f} MiB peak; {last}")

    step("runs, index built from nothing", ["runs", "--limit", "5"])
    step("runs, nothing new", ["runs", "--limit", "5"])
    extra = write_night(work, args.nights, rng)
    append_line(catalog / "folders.txt", str(extra[1].resolve()))
    total += POINTS
    step("runs, one night added", ["runs", "--limit", "5"])
    first, last = nights[0], extra
    out = work / "compare"
    step("compare two nights by run id", ["compare", first[0], last[0], "--out", str(out)], 2 * POINTS)
    step("compare two nights as folders", ["compare", str(first[1]), str(last[1]), "--out", str(out)], 2 * POINTS)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows).assign(host_cpus=len(os.sched_getaffinity(0)),
                                      timestamp=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    table.to_csv(Path(args.out) / "catalog.csv", index=False, float_format="%.4g")
    print(f"bench: {Path(args.out) / 'catalog.csv'}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
