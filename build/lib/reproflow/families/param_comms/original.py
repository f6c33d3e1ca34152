"""The original param `comms.py`, run as it is from a param checkout ($PARAM_DIR), and its parser.

reproflow's options map to param's own flags; an option param cannot honour is rejected, never
passed on to be ignored (param silently ignores unknown flags). The collectives map to the param
names that call the same torch.distributed functions as reproflow: all_gather -> all_gather_base
(all_gather_into_tensor), reduce_scatter -> reduce_scatter_base, all_to_all -> all_to_allv
(all_to_all_single with equal splits). Ranks are started with RANK / WORLD_SIZE / MASTER_* in the
environment, not torchrun, because torchrun takes param's --b / --e for its own flags.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproflow.rank.context import RunContext
from reproflow.rank.tools import ToolOutputError, checkout_commit, param_checkout, read_output, run_group
from reproflow.spec.errors import ParamError
from reproflow.spec.family import Measurement

PARAM_COLLECTIVE = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather_base",
    "reduce_scatter": "reduce_scatter_base",
    "all_to_all": "all_to_allv",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
PARAM_DTYPE = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
               "int32": "int32", "int64": "long"}
COMMS_SCRIPT = Path("train") / "comms" / "pt" / "comms.py"
STATS_COLUMNS = ("latency_p50_us", "latency_p75_us", "latency_p95_us", "latency_min_us", "latency_max_us")


@dataclass(frozen=True)
class CommsRow:
    """One COMMS-RES line."""

    collective: str
    dtype: str
    size_bytes: int
    elements_per_rank: int
    stats_us: dict[str, float]
    algbw: float
    busbw: float


_ALL_SIZES = re.compile(r"allSizes:\s*\[([\d,\s]*)\]")
_RESULT = re.compile(r"^\s*COMMS-RES-(?P<collective>[a-z_]+)-(?P<dtype>[A-Za-z0-9]+)(?:-\S+)?\s+(?P<rest>.*)$")
# The column header comms.py prints before its results: pair mode (--pair) adds nElementsPairPerRank after
# nElementsPerRank, comms-compute mode (a GEMM kernel beside) adds TFlops at the end.
_HEADER = re.compile(r"^\s*COMMS-RES\s+(?:total-)?size \(B\).*$", re.M)


def _columns(text: str) -> tuple[bool, bool]:
    """(pair mode, TFlops column) from comms.py's header; a run of another mode is refused naming it."""
    header = _HEADER.search(text)
    if header is None:
        raise ToolOutputError("no 'COMMS-RES  size (B) ...' header line: the result columns cannot be told apart "
                              "(comms.py prints it before its first result)")
    line = header.group(0)
    if "pingLatency" in line:
        raise ToolOutputError("a pt2pt run (ping latency and uni/bi-directional bandwidth columns): reproflow reads "
                              "collectives' results; run comms.py with --collective")
    return "nElementsPairPerRank" in line, "TFlops" in line


def parse_comms(text: str) -> list[CommsRow]:
    """Rows of a param comms.py run (rank 0's output), checked against the sizes param announced; the
    columns read by the header's mode (plain, pair, with TFlops)."""
    announced = _ALL_SIZES.search(text)
    if announced is None:
        raise ToolOutputError("no 'allSizes: [...]' line: this is not comms.py output, or it stopped before its sweep")
    sizes = [int(s) for s in announced.group(1).replace(",", " ").split()]
    pair, tflops = _columns(text)
    expected = 9 + pair + tflops
    mode = " (pair mode)" * pair + " (with the TFlops of comms-compute mode)" * tflops
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = _RESULT.match(line)
        if not match:
            continue
        fields = match.group("rest").split()
        try:
            values = [float(f) for f in fields]
        except ValueError:
            raise ToolOutputError(f"line {number}: non-numeric field in {line.strip()!r}") from None
        if len(values) != expected:
            raise ToolOutputError(f"line {number}: expected {expected} numbers after the tag{mode}, got "
                                  f"{len(values)}: {line.strip()!r}")
        if not all(math.isfinite(v) for v in values):
            raise ToolOutputError(f"line {number}: a value that is not a finite number in {line.strip()!r}")
        stats = values[2 + pair:7 + pair]
        rows.append(CommsRow(match.group("collective"), match.group("dtype"), int(values[0]), int(values[1]),
                             dict(zip(STATS_COLUMNS, stats, strict=True)), values[7 + pair], values[8 + pair]))
    got = [r.size_bytes for r in rows]
    if got != sizes:
        raise ToolOutputError(f"param announced {len(sizes)} sizes {sizes[:3]}... but printed {len(got)} result lines "
                         f"{got[:3]}...: the output is truncated or mixed with another run")
    return rows


def check(params: Mapping[str, Any]) -> None:
    """Options param cannot honour."""
    if params["collective"] not in PARAM_COLLECTIVE:
        raise ParamError(f"param's comms.py has no {params['collective']!r} in the nccl-tests sense (its pt2pt mode "
                         "measures ping-pong and windowed bandwidth).", ", ".join(PARAM_COLLECTIVE))
    if params["check"] and not params["blocking"] and params["collective"] in ("all_reduce", "reduce"):
        # comms.py turns --c 1 off for reduce collectives in non-blocking mode, with only a warning.
        raise ParamError(f"param's comms.py cannot check {params['collective']} data in non-blocking mode; "
                         "set check = false or blocking = true.")


def runtime_check(params: Mapping[str, Any], backend: str) -> None:
    """What the job's environment must provide."""
    param_checkout(COMMS_SCRIPT)
    if params["dtype"] == "bfloat16" and backend == "gloo":
        raise ParamError("param's comms.py refuses bfloat16 with gloo; use float32 or NCCL.")


def argv(params: Mapping[str, Any], backend: str, device: str, script: Path) -> list[str]:
    """comms.py's command line for one point ({MASTER_ADDR}/{MASTER_PORT} filled in per run)."""
    return [
        sys.executable, str(script),
        "--master-ip", "{MASTER_ADDR}", "--master-port", "{MASTER_PORT}",
        "--backend", backend, "--device", device,
        "--collective", PARAM_COLLECTIVE[params["collective"]],
        "--b", str(params["begin_size"]), "--e", str(params["end_size"]),
        "--f", str(params["step_factor"]), "--sb", str(params["step_bytes"]),
        "--w", str(params["warmup_iters"]), "--n", str(params["iters"]),
        "--z", "1" if params["blocking"] else "0",
        "--data-type", PARAM_DTYPE[params["dtype"]],
        "--root", str(params["root"]),
        "--c", "1" if params["check"] else "0",
    ]


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Run comms.py for the point's sweep and turn rank 0's COMMS-RES lines into measurements."""
    root = param_checkout(COMMS_SCRIPT)
    cmd = argv(params, ctx.backend, ctx.device.type, root / COMMS_SCRIPT)
    result = run_group(ctx, cmd, cwd=str(root / COMMS_SCRIPT.parent))
    # Only rank 0 of comms.py prints the results.
    rows = read_output(ctx, (lambda: parse_comms(result.output)) if ctx.rank == 0 else None, "comms.py") or []
    tool = {"tool_version": checkout_commit(root, "PARAM_COMMIT"), "command": result.command}
    out: list[Measurement] = []
    for row in rows:
        coords = {"size_bytes": row.size_bytes, "elements_per_rank": row.elements_per_rank} | tool
        out.extend(Measurement(name, value, "us", coords) for name, value in row.stats_us.items())
        out.append(Measurement("algbw", row.algbw, "GB/s", coords))
        out.append(Measurement("busbw", row.busbw, "GB/s", coords))
    return out
