"""Aceso's profiled database, in the reference's exact file format, so each side reads the other's.

* `{model}_{size}_mbs{M}_tp{T}_algo{A}.csv`: one row per distinct op, in op order, header
  `op_name,forward-compute,backward-compute,input_size,output_size,weights,activations,fwd_reserved,bwd_reserved`;
  times in microseconds, sizes in MB (2^20 bytes), three decimals.
* `prim_{model}_{size}_{collective}_{N}gpus.csv`: `data_size(MB),time(ms)`, one row per integer MB.
* `p2p_intra_node.csv`, `p2p_inter_node.csv`: a row of sizes in MB, then a row of GB/s.
* `p2p_latency.csv` (reproflow's): `link,latency(us)`, a one-element message per link (intra, inter).
* `opt_{model}_{size}_tp{T}.csv` (reproflow's, not the reference's): `op_name,optimizer-step`, the
  microseconds of one Adam step over each op's weights at TP size T; the runtime model needs it.

Entries that were not profiled read as 1e6, as in the reference, so a config that needs them is
never chosen; a collective size missing from its table costs 100000 ms.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from reproflow.families.aceso.models import Model
from reproflow.spec.errors import ReproflowError
from reproflow.store.files import atomic_write

OP_COLUMNS = ("op_name", "forward-compute", "backward-compute", "input_size", "output_size", "weights",
              "activations", "fwd_reserved", "bwd_reserved")
FIELDS = OP_COLUMNS[1:]
COLLECTIVE_HEADER = ("data_size(MB)", "time(ms)")
MISSING = 1e6
MISSING_COLLECTIVE_MS = 100000.0
COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all")
# Written beside profiles reproflow measured on CPU (float32); the reference's databases are fp16.
PRECISION_FILE = "precision.txt"
# Suffix of a profile suite run right after a training, on the trained config's ops.
AFTER_TRAINING = "-after-training"


def op_file(model: Model, mbs: int, tp: int, algo: int) -> str:
    return f"{model.file_stem}_mbs{mbs}_tp{tp}_algo{algo}.csv"


def collective_file(model: Model, prim: str, gpus: int) -> str:
    return f"prim_{model.file_stem}_{prim}_{gpus}gpus.csv"


def optimizer_file(model: Model, tp: int) -> str:
    return f"opt_{model.file_stem}_tp{tp}.csv"


OPTIMIZER_HEADER = ("op_name", "optimizer-step")
# reproflow's too: the time of a one-element message per link, which the bandwidth table leaves out.
P2P_LATENCY_FILE, P2P_LATENCY_HEADER = "p2p_latency.csv", ("link", "latency(us)")


@dataclass
class Database:
    """Op profiles as arrays [field][op, mbs index, log2(tp), algo], plus collectives and P2P bandwidth."""

    model: Model
    ops: list[str]  # distinct ops in model order
    mbs: list[int]
    tps: list[int]
    table: np.ndarray  # shape (len(FIELDS), ops, mbs, tps, 2)
    collectives: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    intra_band: list[float] = field(default_factory=list)  # GB/s at 1, 2, 4, ... MB
    inter_band: list[float] = field(default_factory=list)
    fp32: bool = False  # profiled in float32 (reproflow on CPU): no fp16 master copies to model
    # Profiled on GPUs, whose caching allocator reserves memory beyond what tensors hold (reproflow's CPU
    # profile, its precision file saying float32, reserves nothing)
    caching_allocator: bool = True
    optimizer_us: dict[int, np.ndarray] = field(default_factory=dict)  # per TP size: Adam step per distinct op
    latency_us: dict[str, float] = field(default_factory=dict)  # per link (intra, inter): a message's fixed cost
    path: Path = Path()

    @property
    def memory_ratios(self) -> tuple[int, int]:
        """(master copy, optimizer state) per weight byte; a float32 database trains as float32."""
        return (0, 2) if self.fp32 else self.model.memory_ratios

    def index(self) -> dict[str, int]:
        return {op: i for i, op in enumerate(self.ops)}

    def collective_ms(self, prim: str, gpus: int, size_mb: float) -> float:
        """Time of a collective on `gpus` ranks, looked up by whole MB as the reference does."""
        if prim == "split":
            return 0.0
        sizes = self.collectives.get(prim, {}).get(gpus, {})
        for key in (f"{size_mb:.0f}", f"{size_mb - 1:.0f}"):
            if key in sizes:
                return sizes[key]
        return MISSING_COLLECTIVE_MS

    def all_reduce_ms(self, gpus: int, size_mb: float, cross_node: bool) -> float:
        """A gradient all-reduce of `size_mb` over `gpus` ranks: the profiled table, interpolated between
        its whole-MB sizes and, past its largest, the least-squares line through it (a table measured on
        busy cores is not monotonic); across nodes (no table), a ring's 2 (n - 1) / n of the data over
        the inter-node P2P bandwidth."""
        table = self.collectives.get("all_reduce", {}).get(gpus)
        if cross_node or not table:
            if not cross_node:
                raise ReproflowError(f"{self.path / collective_file(self.model, 'all_reduce', gpus)}: missing; the "
                                     f"runtime model of {self.model.file_stem} needs the gradient all-reduce over "
                                     f"{gpus} GPUs. Profile the collectives, or use --model reference.")
            return 2 * (gpus - 1) / gpus * size_mb / self.bandwidth(size_mb, True) / 1000
        sizes = np.array(sorted(float(k) for k in table))
        times = np.array([table[f"{x:.0f}"] for x in sizes])
        if size_mb <= sizes[-1] or len(sizes) < 2:
            return float(np.interp(size_mb, sizes, times))
        slope, intercept = np.polyfit(sizes, times, 1)
        return float(max(intercept + max(slope, 0.0) * size_mb, times[-1]))

    def bandwidth(self, size_mb: float, cross_node: bool, reference: bool = False) -> float:
        """P2P bandwidth in MB per microsecond for a message of `size_mb` (1 when nothing is sent).

        Table entry i is 2^i MB, looked up one below log2 as the reference does. Under 1 MB the
        reference's index is negative and counts from the end of the table (`reference`); otherwise
        messages under 1 MB use the smallest entry."""
        band = self.inter_band if cross_node and self.inter_band else self.intra_band
        if size_mb <= 0 or not band:
            return 1.0
        i = int(math.log(size_mb, 2))
        i = i - 1 if i >= 1 else i
        if i < 0:
            i = max(i, -len(band)) if reference else 0
        return band[min(i, len(band) - 1)] * 0.001


_OP_FILE = re.compile(r"_mbs(\d+)_tp(\d+)_algo(\d+)\.csv$")


def read_database(path: Path, model: Model, mbs_list: list[int], max_tp: int) -> Database:
    """Read every op file of `model` for the micro-batch sizes and TP sizes asked for."""
    path = Path(path)
    tps = [2**i for i in range(int(math.log2(max_tp)) + 1)]
    first = path / op_file(model, mbs_list[0], 1, 0)
    if not first.is_file():
        raise ReproflowError(f"no profile {first}: the database at {path} lacks {model.file_stem} at micro-batch "
                             f"{mbs_list[0]}, tp 1. Profile it (reproflow aceso profile) or point "
                             "--profiled-time-path at a database that has it.")
    ops = [row[0] for row in _rows(first, OP_COLUMNS)]
    table = np.full((len(FIELDS), len(ops), len(mbs_list), len(tps), 2), MISSING)
    where = {op: i for i, op in enumerate(ops)}
    for m, mbs in enumerate(mbs_list):
        for t, tp in enumerate(tps):
            for algo in model.algos:
                f = path / op_file(model, mbs, tp, algo)
                if not f.is_file():
                    continue
                for row in _rows(f, OP_COLUMNS):
                    if row[0] not in where:
                        raise ReproflowError(f"{f}: op {row[0]!r} is not in {first.name}; the files of one "
                                             "model must list the same ops.")
                    table[:, where[row[0]], m, t, algo] = [float(x) for x in row[1:]]
    precision = path / PRECISION_FILE
    on_cpu = precision.is_file() and precision.read_text().strip() == "float32"
    db = Database(model, ops, list(mbs_list), tps, table, fp32=on_cpu or not model.fp16, caching_allocator=not on_cpu,
                  path=path)
    for prim in COLLECTIVES:
        for gpus in tps[1:]:
            f = path / collective_file(model, prim, gpus)
            if f.is_file():
                db.collectives.setdefault(prim, {})[gpus] = {row[0]: float(row[1]) for row in
                                                             _rows(f, COLLECTIVE_HEADER)}
    for tp in tps:
        f = path / optimizer_file(model, tp)
        if f.is_file():
            us = np.full(len(ops), np.nan)
            for row in _rows(f, OPTIMIZER_HEADER):
                if row[0] in where:
                    us[where[row[0]]] = float(row[1])
            db.optimizer_us[tp] = us
    f = path / P2P_LATENCY_FILE
    if f.is_file():
        db.latency_us = {row[0]: float(row[1]) for row in _rows(f, P2P_LATENCY_HEADER)}
    for name, attr in (("p2p_intra_node.csv", "intra_band"), ("p2p_inter_node.csv", "inter_band")):
        f = path / name
        if f.is_file():
            lines = list(csv.reader(f.open()))
            setattr(db, attr, [float(x) for x in lines[1]])
    return db


def _rows(path: Path, header: tuple[str, ...]) -> list[list[str]]:
    with path.open() as fh:
        rows = [[c.strip() for c in r] for r in csv.reader(fh) if r]
    if not rows or tuple(rows[0]) != header:
        raise ReproflowError(f"{path}: header {rows[0] if rows else '(empty file)'} is not {','.join(header)}.")
    bad = [i + 2 for i, r in enumerate(rows[1:]) if len(r) != len(header)]
    if bad:
        raise ReproflowError(f"{path}: line {bad[0]} has the wrong number of fields (want {len(header)}).")
    return rows[1:]


def write_op_table(path: Path, rows: list[tuple[str, list[float]]]) -> None:
    """One op file: (op name, the eight numbers) per distinct op, in op order."""
    lines = [",".join(OP_COLUMNS)] + [f"{name}," + ",".join(f"{v:.3f}" for v in values) for name, values in rows]
    atomic_write(path, "\n".join(lines) + "\n")


def write_collective_table(path: Path, rows: list[tuple[int, float]]) -> None:
    lines = [",".join(COLLECTIVE_HEADER)] + [f"{mb},{ms:.3f}" for mb, ms in rows]
    atomic_write(path, "\n".join(lines) + "\n")


def write_p2p(path: Path, sizes_mb: list[int], gbps: list[float]) -> None:
    atomic_write(path, ",".join(str(s) for s in sizes_mb) + "\n" + ",".join(f"{b:.2f}" for b in gbps) + "\n")


def write_from_rows(frame: pd.DataFrame, out: Path, after_training: bool = False) -> list[Path]:
    """Aceso's files from the profiler's rows (family aceso), from the newest measurement of each
    (of a profile in rounds: each op's median over the rounds of the newest suite):
    op files per model, size, micro-batch, TP size and algo; collective tables per model, size,
    collective and GPU count; P2P bandwidth per link (intra- or inter-node). The profiles taken right
    after a training (suites named ...-after-training-<iterations>) make a database of their own
    (`after_training`): they are newer than the profile a search read, and must not replace it."""
    suites = frame["suite"].astype(str) if "suite" in frame.columns else pd.Series("", index=frame.index)
    rows = frame[(frame["family"] == "aceso") & (suites.str.contains(AFTER_TRAINING, regex=False) == after_training)]
    if "kind" not in rows.columns:
        rows = rows.assign(kind="ops")
    written = []
    ops = rows[rows["kind"] == "ops"]
    optimizer: dict[Path, list[tuple[str, float]]] = {}
    for (name, size, mbs, tp, algo), sub in _groups(ops, ["model", "size", "mbs", "tp", "algo"]):
        wide = _rounds(sub).pivot_table(index=["op_index", "op"], columns="metric", values="value",
                                        aggfunc="median").reset_index()
        missing = [f for f in FIELDS if f not in wide.columns]
        if missing:
            raise ReproflowError(f"profiler rows of {name} {size} mbs {mbs} tp {tp} algo {algo} lack {missing}.")
        path = out / op_file(Model(str(name), str(size), 1), int(mbs), int(tp), int(algo))
        write_op_table(path, [(str(r["op"]), [float(r[f]) for f in FIELDS])
                              for _, r in wide.sort_values("op_index").iterrows()])
        written.append(path)
        opt = out / optimizer_file(Model(str(name), str(size), 1), int(tp))
        if "optimizer-step" in wide.columns and opt not in optimizer:  # the smallest micro-batch, algo 0
            optimizer[opt] = [(str(r["op"]), float(r["optimizer-step"]))
                              for _, r in wide.sort_values("op_index").iterrows()]
    for opt, table in optimizer.items():
        atomic_write(opt, ",".join(OPTIMIZER_HEADER) + "\n" + "".join(f"{op},{us:.3f}\n" for op, us in table))
        written.append(opt)
    if not ops.empty and "device" in ops.columns:
        path = out / PRECISION_FILE
        atomic_write(path, ("float32" if set(ops["device"]) == {"cpu"} else "float16") + "\n")
        written.append(path)
    coll = rows[rows["kind"] == "collectives"]
    for (name, size, prim, gpus), sub in _groups(coll, ["model", "size", "prim", "gpus"]):
        sub = _newest(sub).sort_values("size_mb")
        path = out / collective_file(Model(str(name), str(size), 1), str(prim), int(gpus))
        write_collective_table(path, [(int(r["size_mb"]), float(r["value"])) for _, r in sub.iterrows()])
        written.append(path)
    latency = []
    for (link,), sub in _groups(rows[rows["kind"] == "p2p"], ["link"]):
        sub = _newest(sub).sort_values("size_mb")
        band = sub[sub["metric"] == "bandwidth"]
        path = out / f"p2p_{link}_node.csv"
        write_p2p(path, [int(x) for x in band["size_mb"]], [float(x) for x in band["value"]])
        written.append(path)
        latency += [f"{link},{float(v):.3f}\n" for v in sub[sub["metric"] == "latency"]["value"]]
    if latency:
        atomic_write(out / P2P_LATENCY_FILE, ",".join(P2P_LATENCY_HEADER) + "\n" + "".join(latency))
        written.append(out / P2P_LATENCY_FILE)
    return written


def _groups(rows: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """Groups of `rows` by `keys`; none when there are no such rows (their columns may be absent)."""
    return [] if rows.empty else list(rows.groupby(keys))


def _newest(sub: pd.DataFrame) -> pd.DataFrame:
    return sub[sub["timestamp"] == sub["timestamp"].max()]


def _rounds(sub: pd.DataFrame) -> pd.DataFrame:
    """The newest measurement of each round of a profile in rounds (one round where it is not), from the
    suite that measured last: a point's rows, for a median over its rounds."""
    if "suite" in sub.columns:
        sub = sub[sub["suite"] == _newest(sub)["suite"].iloc[0]]
    if "round" not in sub.columns:
        return _newest(sub)
    return pd.concat([_newest(one) for _, one in sub.groupby("round", dropna=False)])
