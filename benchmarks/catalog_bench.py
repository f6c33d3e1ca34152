"""`make bench`: the run catalog at the size of a year of nightly runs, on one cluster or several.

Generates a results folder per cluster and night (365 nights; by default one cluster of 274 points a
night, 100,010 point files in all; `--clusters 3 --points 913` makes 1,000,000), written from the
result writer's rows (param_comms: busBW and time at two message sizes, 5 repeats, a run id and a
manifest each; plain writes, not the writer's fsync, to generate a million in minutes), lists them
in a catalog of their own, then times each command in a process of its own and reads its peak
memory (the largest resident set of the command's processes, its readers included):

1. `reproflow runs`, the index built from nothing;
2. `reproflow runs` again, nothing new;
3. one more night written, then `reproflow runs` (only its files read);
4. `reproflow compare` of the first night and the last, by run id;
5. the same two nights given as results folders;
6. `reproflow history` of one point's busBW over the year, on every cluster;
7. and 8. the same `compare` and `history` with a catalog of their own holding only what they read (the
   two nights' folders; that one point's files, a folder a night): the commands' cost at any catalog
   size (the interpreter, the libraries' imports, the figures), beside which 4 and 6 show what the
   catalog's size adds.

With `--baseline REV[,REV...]`, each step runs with those commits' reproflow too (each `src` with a
catalog of its own), just before this checkout's, on the same folders: before and after in one run.

-> <out>/catalog.csv (version, step, points in the catalog, points compared, seconds, µs a point
for the cold index, peak MiB, CPU seconds and minor page faults of the command and its readers).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from stamp import stamp

from reproflow.spec.family import Measurement
from reproflow.store.files import append_line
from reproflow.store.provenance import Provenance
from reproflow.store.results import make_rows, point_path, rows_to_csv
from reproflow.store.runs import manifest_path

NIGHTS, POINTS = 365, 274
SIZES = 2  # message sizes a point sweeps (1 MiB, 2 MiB, ...): 20 rows a file; --sizes 29: 290
HISTORY_POINT = "collective=all_reduce,group=0"


def write_night(root: Path, points: int, cluster: int, night: int, sizes: int = SIZES) -> tuple[str, Path]:
    """One cluster's night: a results folder of `points` points and the run's manifest; (run id, folder)."""
    rng = np.random.default_rng([cluster, night])
    day = _dt.date(2025, 11, 26) + _dt.timedelta(days=night)
    run_id = f"{day:%Y%m%d}-02{cluster:02d}00-{night:06x}"
    results = root / f"c{cluster}" / f"{day}" / "results"
    prov = Provenance(f"{1000 + night}", f"c{cluster}n1,c{cluster}n2", 16, "nccl", "cuda", "NVIDIA H100 80GB HBM3",
                      "2.13.0", "2.28.9", f"{night:040x}", "", "", run_id=run_id)
    for point in range(points):
        collective = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")[point % 4]
        measured = []
        for size in (1 << (20 + k) for k in range(sizes)):
            noise = np.exp(rng.normal(0.0, 0.03, 5))
            measured += [(r, m) for r, n in enumerate(noise) for m in (
                Measurement("busbw", 300.0 * n, "GB/s", {"size_bytes": size}),
                Measurement("time_us", size / 3e5 / n, "us", {"size_bytes": size}))]
        key = f"collective={collective},group={point}"
        rows = make_rows({"suite": "nightly", "experiment": "comms", "family": "param_comms", "point": key},
                         {"collective": collective, "iters": point}, measured, prov)
        path = point_path(results, "nightly", "comms", key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rows_to_csv(rows))
    manifest = {"run_id": run_id, "command": ["reproflow", "submit", "nightly"], "results": str(results),
                "suites": ["nightly"], "executor": "slurm", "cluster": f"bench{cluster}", "nodes": 2,
                "start": f"{day}T02:{cluster:02d}:00+00:00", "end": f"{day}T02:40:00+00:00", "state": "completed",
                "exit_code": 0}
    path = manifest_path(results, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest) + "\n")
    return run_id, results


def timed(args: list[str], env: dict[str, str], log: Path) -> tuple[float, os.struct_rusage, str]:
    """Seconds and resource usage of one reproflow command in a process of its own (wait4's: its own and
    its reader processes' CPU time and faults, the largest resident set among them), and its last line."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "reproflow.app.cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    text = log.read_text()
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"bench: reproflow {' '.join(args)} failed:\n{text[-3000:]}")
    return seconds, usage, (text.strip().splitlines() or [""])[-1]


def list_folders(env: dict[str, str], folders: list[Path]) -> None:
    """Results folders added to the catalog of `env`, as `reproflow run` adds them."""
    for folder in folders:
        append_line(Path(env["REPROFLOW_CATALOG"]) / "folders.txt", str(folder.resolve()))


def own_catalog(env: dict[str, str], name: str, folders: list[Path], log: Path) -> dict[str, str]:
    """`env` with a catalog of its own listing only `folders`, its index built (not timed)."""
    env = dict(env, REPROFLOW_CATALOG=env["REPROFLOW_CATALOG"] + f"-{name}")
    shutil.rmtree(env["REPROFLOW_CATALOG"], ignore_errors=True)
    list_folders(env, folders)
    timed(["runs", "--limit", "1"], env, log)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="folder for catalog.csv")
    parser.add_argument("--work", default="", help="where the generated folders go (default: a temporary folder)")
    parser.add_argument("--nights", type=int, default=NIGHTS, help="nights a cluster")
    parser.add_argument("--clusters", type=int, default=1, help="clusters, a results folder each a night")
    parser.add_argument("--points", type=int, default=POINTS, help="points a night and cluster")
    parser.add_argument("--sizes", type=int, default=SIZES, help="message sizes a point (rows a file: 10 each)")
    parser.add_argument("--baseline", default="", help="commits (REV,REV...) whose reproflow runs each step too")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="reproflow-catalog-bench-"))
    versions = {"now": dict(os.environ, REPROFLOW_CATALOG=str(work / "catalog-now"))}
    for rev in filter(None, args.baseline.split(",")):
        tree = work / f"baseline-{rev}"
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", rev, "src"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        versions = {rev: dict(os.environ, REPROFLOW_CATALOG=str(work / f"catalog-{rev}"),
                              PYTHONPATH=str(tree / "src")), **versions}
    for env in versions.values():
        env.pop("REPROFLOW_RUN_ID", None)
    start = time.perf_counter()
    jobs = [(c, n) for c in range(args.clusters) for n in range(args.nights)]
    write = functools.partial(write_night, work, args.points, sizes=args.sizes)
    with multiprocessing.get_context("fork").Pool(len(os.sched_getaffinity(0))) as pool:
        nights = pool.starmap(write, jobs, chunksize=4)
    for env in versions.values():
        list_folders(env, [results for _, results in nights])
    generated = time.perf_counter() - start
    total = len(jobs) * args.points
    print(f"bench: {total} points in {len(jobs)} folders written in {generated:.0f} s under {work}")
    rows = [{"version": "", "step": "generate the folders (not reproflow)", "catalog_points": total,
             "compared_points": 0, "seconds": generated}]

    def step(name: str, command: list[str], compared: int = 0, catalogs: dict[str, dict[str, str]] | None = None,
             points: int = 0) -> None:
        for version, env in (catalogs or versions).items():
            seconds, usage, last = timed(command, env, work / "command.log")
            cpu = usage.ru_utime + usage.ru_stime
            per_point = seconds / total * 1e6 if name.startswith("runs, index built") else np.nan
            rows.append({"version": version, "step": name, "catalog_points": points or total,
                         "compared_points": compared, "seconds": seconds, "us_per_point": per_point,
                         "peak_mib": usage.ru_maxrss / 1024, "cpu_s": cpu, "minor_faults": usage.ru_minflt})
            print(f"bench: {version}: {name}: {seconds:.2f} s, {cpu:.2f} s CPU, {usage.ru_maxrss / 1024:.0f} MiB "
                  f"peak; {last}")

    step("runs, index built from nothing", ["runs", "--limit", "5"])
    step("runs, nothing new", ["runs", "--limit", "5"])
    extra = write_night(work, args.points, 0, args.nights, args.sizes)
    for env in versions.values():
        list_folders(env, [extra[1]])
    total += args.points
    step("runs, one night added", ["runs", "--limit", "5"])
    first, last = nights[0], extra
    out = work / "compare"
    step("compare two nights by run id", ["compare", first[0], last[0], "--out", str(out)], 2 * args.points)
    step("compare two nights as folders", ["compare", str(first[1]), str(last[1]), "--out", str(out)],
         2 * args.points)
    history = ["history", "--suite", "nightly", "--point", HISTORY_POINT, "--metric", "busbw", "--out",
               str(work / "history")]
    step("history of one point over the year", history, 2 * (len(jobs) + 1))
    # The same two commands on catalogs of only what they read: the first night and the last; the one
    # point's file of each night (the point a night's first, so the same values, run ids and manifests).
    two = {v: own_catalog(env, "two", [first[1], last[1]], work / "command.log") for v, env in versions.items()}
    step("compare two nights by run id, a catalog of those two only", ["compare", first[0], last[0], "--out", str(out)],
         2 * args.points, two, 2 * args.points)
    alone = [write_night(work / "one", 1, c, n)[1] for c, n in [*jobs, (0, args.nights)]]
    one = {v: own_catalog(env, "one", alone, work / "command.log") for v, env in versions.items()}
    step("history of one point over the year, a catalog of that point only", history, 2 * len(alone), one,
         len(alone))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    table = stamp(pd.DataFrame(rows))
    name = "catalog.csv" if total < 500_000 else "catalog-million.csv"
    table.to_csv(Path(args.out) / name, index=False, float_format="%.4g")
    print(f"bench: {Path(args.out) / name}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
