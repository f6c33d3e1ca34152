"""The original param compute `driver.py`, run as it is from a param checkout ($PARAM_DIR), and its parser.

Every rank runs the driver on its own device (CUDA_VISIBLE_DEVICES = local rank, since the driver
uses cuda:0). The time per step it prints is kept; rates are computed from it with the family's
formulas, which are param's own (param prints them rounded to 1-3 decimals).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reproflow.rank.context import RunContext
from reproflow.rank.tools import ToolOutputError, checkout_commit, param_checkout, read_output, run_group
from reproflow.spec.errors import ParamError

DRIVER = Path("train") / "compute" / "pt" / "driver.py"
# Numbers per result line and the column holding the time per step.
COLUMNS = {"gemm": (5, 3), "emb": (7, 4), "linear": (8, 5)}
_HEADER = re.compile(r"Measuring the performance of\s+(\w+)\s+on device")


def parse_compute(text: str, kernel: str, expected: Sequence[tuple[int, ...]]) -> list[tuple[tuple[int, ...], float]]:
    """(shape, seconds per step) for every line of a driver.py run, checked against the expected shapes."""
    header = _HEADER.search(text)
    if header is None or header.group(1) != kernel:
        found = header.group(1) if header else "no 'Measuring the performance of' line"
        raise ToolOutputError(f"not param driver.py output for {kernel!r} ({found})")
    count, time_col = COLUMNS[kernel]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = [f for f in re.split(r"[,\s]+", line.strip()) if f]
        if not fields or not re.fullmatch(r"\d+", fields[0]) or "=" in line:
            continue
        try:
            values = [float(f) for f in fields]
        except ValueError:
            raise ToolOutputError(f"line {number}: non-numeric field in {line.strip()!r}") from None
        if len(values) != count:
            raise ToolOutputError(f"line {number}: expected {count} numbers for {kernel}, got {len(values)}: "
                             f"{line.strip()!r}")
        shape = tuple(int(v) for v in values[:time_col])
        if kernel == "linear":  # param prints len(layers_size) = layers + 2 in its #Layer column
            shape = (shape[0] - 2, *shape[1:])
        rows.append((shape, values[time_col]))
    shapes = [s for s, _ in rows]
    if shapes != [tuple(s) for s in expected]:
        raise ToolOutputError(f"expected {len(expected)} result lines for shapes {list(expected)[:2]}..., got "
                         f"{len(shapes)} {shapes[:2]}...: the output is truncated or from another dataset")
    return rows


def check(params: Mapping[str, Any]) -> None:
    """Options driver.py cannot honour."""
    if params["shapes"]:
        raise ParamError("param's driver.py measures its datasets only; remove 'shapes' or use implementation "
                         "'reproflow'.")
    if params["dataset"] == "S":
        raise ParamError("dataset 'S' is reproflow's; param's driver.py has A, B, C (gemm), A, B (emb), A (linear).")
    if params["kernel"] == "linear" and params["dtype"] == "tf32":
        raise ParamError("param's linear kernel has no tf32 type.", "float32, float16, bfloat16")


def runtime_check(params: Mapping[str, Any], device: str) -> None:
    """What the job's environment must provide."""
    param_checkout(DRIVER)
    if params["kernel"] == "linear" and params["optimizer"] == "none" and device == "cpu":
        raise ParamError("param's driver.py always steps the optimizer on CPU; use optimizer 'sgd' or 'adagrad'.")


def argv(params: Mapping[str, Any], device: str, script: Path) -> list[str]:
    """driver.py's command line for one point."""
    kernel = params["kernel"]
    cmd = [sys.executable, str(script), "--steps", str(params["steps"]), "--warmups", str(params["warmups"]),
           "--device", "gpu" if device == "cuda" else "cpu", kernel, "--dataset", params["dataset"]]
    if kernel == "gemm":
        cmd += ["--dtype", params["dtype"]]
    elif kernel == "linear":
        cmd += ["--dtype", "float" if params["dtype"] == "float32" else params["dtype"]]
        if params["optimizer"] != "none":
            cmd += ["--optimizer", "--optimizer-type", params["optimizer"]]
    return cmd


def measure(ctx: RunContext, params: Mapping[str, Any], expected: Sequence[tuple[int, ...]]
            ) -> tuple[list[tuple[tuple[int, ...], float]], dict[str, str]]:
    """This rank's (shape, seconds) from driver.py, and the tool columns for the rows."""
    root = param_checkout(DRIVER)
    cmd = argv(params, ctx.device.type, root / DRIVER)
    env = {"CUDA_VISIBLE_DEVICES": str(ctx.local_rank)} if ctx.device.type == "cuda" else {}
    result = run_group(ctx, cmd, env=env, cwd=str(root / DRIVER.parent))
    rows = read_output(ctx, lambda: parse_compute(result.output, params["kernel"], expected), "driver.py")
    return rows or [], {"tool_version": checkout_commit(root, "PARAM_COMMIT"), "command": result.command}
