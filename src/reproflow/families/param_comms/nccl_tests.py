"""NVIDIA nccl-tests (`all_reduce_perf` and friends) run as they are from $NCCL_TESTS_DIR, and their parsers.

The single-process binaries (built with MPI=0) run on rank 0 with `-g <ranks>`, one GPU per rank of
the job, while the job's ranks wait: so a point spans one node. (The gpu image also has the MPI build,
`<binary>_mpi`, for a run across nodes as its own `srun --mpi=pmix` step.) reproflow's options map to
nccl-tests' flags; sizes are total buffer sizes in both. Rows take the placement that torch's call
uses: in place for all_reduce, broadcast and reduce, out of place for the others. nccl-tests' time is
its mean over the iterations (and over its GPUs), so rows carry `time_us` rather than percentiles.
Text output and `-J` JSON output (nccl-tests 2.18 and later) parse to the same rows; a run reads both.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproflow.rank.context import RunContext
from reproflow.rank.tools import ToolOutputError, read_output, run_on_rank0
from reproflow.spec.errors import ParamError
from reproflow.spec.family import Measurement

BINARY = {
    "all_reduce": "all_reduce_perf",
    "all_gather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf",
    "all_to_all": "alltoall_perf",
    "broadcast": "broadcast_perf",
    "reduce": "reduce_perf",
    "send_recv": "sendrecv_perf",
}
NCCL_DTYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double",
              "int32": "int32", "int64": "int64"}
IN_PLACE = frozenset({"all_reduce", "broadcast", "reduce"})
PLACEMENTS = ("out_of_place", "in_place")


@dataclass(frozen=True)
class Timing:
    """One placement's columns: mean time (us), algBW and busBW (GB/s), wrong elements (None: unchecked)."""

    time_us: float
    algbw: float
    busbw: float
    wrong: float | None


@dataclass(frozen=True)
class NcclRow:
    """One size of an nccl-tests sweep."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    timings: dict[str, Timing]


@dataclass(frozen=True)
class NcclRun:
    """A whole sweep: its rows and the versions it names."""

    rows: list[NcclRow]
    version: str


def sweep_length(minimum: int, maximum: int, factor: int, step: int) -> int:
    """How many sizes nccl-tests' loop visits (size *= factor when factor > 1, else size += step), computed
    in at most 64 steps; ToolOutputError for a sweep that never ends (its size never grows)."""
    if minimum > maximum:
        return 0
    if factor > 1:
        if minimum <= 0:
            raise ToolOutputError(f"a sweep from {minimum} bytes by a factor of {factor} never grows: not a run "
                                  "that ended")
        n, size = 0, minimum
        while size <= maximum:  # size at least doubles: at most 64 turns for 64-bit sizes
            n, size = n + 1, size * factor
        return n
    if step <= 0:
        raise ToolOutputError(f"a sweep from {minimum} to {maximum} bytes by steps of {step} never grows: not a "
                              "run that ended")
    return (maximum - minimum) // step + 1


def _check_complete(rows: list[NcclRow], expected: int, what: str) -> None:
    if len(rows) < expected:
        raise ToolOutputError(f"{what}: its sweep has {expected} sizes but {len(rows)} result rows: the output is "
                              "truncated, or the run stopped early")
    if len(rows) > expected:
        kinds = sorted({(r.dtype, r.redop) for r in rows})
        why = (f"it holds {len(kinds)} data types or operations ({', '.join('/'.join(k) for k in kinds[:4])}: "
               "-d all or -o all); reproflow runs one of each per point" if len(kinds) > 1 else
               "its sizes repeat: the sweep ran several times (-N, or two runs in one log); give one")
        raise ToolOutputError(f"{what}: {len(rows)} result rows for a sweep of {expected} sizes: {why}")


_HEADER = re.compile(r"#\s*nThread \d+ nGpus \d+ minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\)")
_VERSION = re.compile(r"#\s*nccl-tests version (\S+)(?: nccl-headers=\d+ nccl-library=(\d+))?")
# nccl-tests lowers the sweep's top when the GPU cannot hold it (common.cu), after the header announced it.
_REDUCED = re.compile(r"#\s*Reducing maxBytes to (\d+) due to memory limitation")
# The table's column header, by name: the check columns must be nccl-tests' counts of wrong elements.
_COLUMNS = re.compile(r"^#\s*size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw\s+(\S+)\s+time\s+algbw"
                      r"\s+busbw\s+(\S+)\s*$", re.M)
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\S+)\s+(\S+)", re.M)
_LABEL = re.compile(r"^\s*\d+:\s+[#\d]", re.M)  # srun --label's "0: " before each line


def _nccl_version(code: int) -> str:
    """NCCL's version code (22809) as 2.28.9."""
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def _number(field: str, line: int) -> float | None:
    if field == "N/A":
        return None
    try:
        value = float(field)
    except ValueError:
        raise ToolOutputError(f"line {line}: {field!r} is not a number") from None
    if not math.isfinite(value):
        raise ToolOutputError(f"line {line}: {field!r} is not a finite number")
    return value


def reduced_maximum(text: str) -> int | None:
    """The sweep's top as nccl-tests lowered it for memory (its '# Reducing maxBytes' line), or None."""
    match = _REDUCED.search(text)
    return int(match.group(1)) if match else None


def parse_text(text: str) -> NcclRun:
    """The rows nccl-tests printed, checked against the sweep its header announced (or lowered)."""
    if _LABEL.search(text):
        raise ToolOutputError("its lines carry srun --label prefixes ('0: ...'): give the output of a run without "
                              "--label, or with the prefixes removed")
    header = _HEADER.search(text)
    if header is None:
        raise ToolOutputError("no '# nThread ... minBytes ... maxBytes ... step:' line: this is not nccl-tests "
                              "output, or it stopped before its sweep")
    if re.search(r"^#.*\bcputime\b", text, re.M):
        raise ToolOutputError("a -C 1 run (its 'cputime' column is CPU time): reproflow takes nccl-tests' GPU "
                              "time; run without -C")
    minimum, maximum, step = int(header.group(1)), int(header.group(2)), int(header.group(3))
    lowered = reduced_maximum(text)
    if lowered is not None:
        maximum, minimum = lowered, min(minimum, lowered)
    factor, stepbytes = (step, 0) if header.group(4) == "factor" else (1, step)
    columns = _COLUMNS.search(text)
    if columns is None or columns.group(1) != "#wrong" or columns.group(2) != "#wrong":
        found = " ".join(columns.group(0).lstrip("#").split()) if columns else "no column header line"
        raise ToolOutputError(f"its table's columns are not nccl-tests' 'size count type redop root time algbw "
                              f"busbw #wrong' out of place and in place ({found}): an older or other tool's "
                              "table, whose check column would be read as a count of wrong elements")
    failed = _OUT_OF_BOUNDS.search(text)
    if failed and failed.group(2) != "OK":
        raise ToolOutputError(f"nccl-tests' check failed: '# Out of bounds values : {failed.group(1)} "
                              f"{failed.group(2)}'")
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        if len(fields) != 13:
            raise ToolOutputError(f"line {number}: expected 13 columns (size count type redop root, then time "
                                  f"algbw busbw #wrong out of place and in place), got {len(fields)}: {line.strip()!r}")
        values = [_number(f, number) for f in fields[5:]]
        timings = {}
        for i, placement in enumerate(PLACEMENTS):
            time_us, algbw, busbw, wrong = values[4 * i:4 * i + 4]
            if time_us is None or algbw is None or busbw is None:
                raise ToolOutputError(f"line {number}: no time or bandwidth in {line.strip()!r}")
            timings[placement] = Timing(time_us, algbw, busbw, wrong)
        rows.append(NcclRow(int(fields[0]), int(fields[1]), fields[2], fields[3], int(fields[4]), timings))
    _check_complete(rows, sweep_length(minimum, maximum, factor, stepbytes), "nccl-tests text")
    if "# Avg bus bandwidth" not in text:
        raise ToolOutputError("no '# Avg bus bandwidth' line: the run did not finish")
    version = _VERSION.search(text)
    named = "unknown"
    if version:
        named = version.group(1) + (f" (NCCL {_nccl_version(int(version.group(2)))})" if version.group(2) else "")
    return NcclRun(rows, named)


def _finite(value: object, where: str) -> float:
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise ToolOutputError(f"nccl-tests JSON: {where} is {value!r}, not a finite number")
    return number


def parse_json(text: str, lowered: int | None = None) -> NcclRun:
    """The rows of nccl-tests' `-J` file, checked against the sweep its config announced, or up to
    `lowered` where the run's text said nccl-tests lowered the sweep for memory (the JSON does not)."""
    try:
        doc = json.loads(text)
        config = doc["config"]
        maximum = int(config["maximum_bytes"]) if lowered is None else lowered
        expected = sweep_length(min(int(config["minimum_bytes"]), maximum), maximum,
                                int(config.get("step_factor", 1)), int(config.get("step_bytes", 0)))
        if any("cpu_time" in (r.get("out_of_place") or {}) for r in doc["results"]):
            raise ToolOutputError("nccl-tests JSON of a -C 1 run (cpu_time): reproflow takes nccl-tests' GPU time; "
                                  "run without -C")
        rows = []
        for i, r in enumerate(doc["results"]):
            timings = {p: Timing(_finite(r[p]["time"], f"results[{i}].{p}.time"),
                                 _finite(r[p]["alg_bw"], f"results[{i}].{p}.alg_bw"),
                                 _finite(r[p]["bus_bw"], f"results[{i}].{p}.bus_bw"),
                                 None if r[p].get("nwrong") in (None, "N/A") else
                                 _finite(r[p]["nwrong"], f"results[{i}].{p}.nwrong"))
                       for p in PLACEMENTS}
            rows.append(NcclRow(int(r["size"]), int(r["count"]), str(r["type"]), str(r["redop"]),
                                int(str(r["root"]).strip()), timings))
    except json.JSONDecodeError as exc:
        raise ToolOutputError(f"nccl-tests JSON is not complete JSON ({exc.msg} at character {exc.pos}): the run "
                              "stopped while writing it") from None
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ToolOutputError):
            raise
        raise ToolOutputError(f"nccl-tests JSON lacks or garbles a field ({exc!r}): not a -J file of nccl-tests "
                              "2.18 or later") from None
    if lowered is None and len(rows) < expected:
        raise ToolOutputError(f"nccl-tests JSON: its sweep has {expected} sizes but {len(rows)} result rows: the "
                              "output is truncated, the run stopped early, or nccl-tests lowered the sweep for "
                              "memory, which only its text output says (read both)")
    _check_complete(rows, expected, "nccl-tests JSON")
    version = doc.get("nccl_version")
    return NcclRun(rows, "unknown" if version is None else f"NCCL {_nccl_version(int(version))}")


def binaries() -> Path:
    """$NCCL_TESTS_DIR, or ParamError saying how to provide it."""
    value = os.environ.get("NCCL_TESTS_DIR", "")
    if value and (Path(value) / BINARY["all_reduce"]).is_file():
        return Path(value)
    raise ParamError(f"implementation 'nccl-tests' needs $NCCL_TESTS_DIR pointing at nccl-tests' build folder "
                     f"(NCCL_TESTS_DIR={value!r}); the gpu image sets it, or build them: make -C nccl-tests MPI=0.")


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    """GPUs, one node, and the binaries where the job runs."""
    if ctx.device.type != "cuda":
        raise ParamError("implementation 'nccl-tests' needs GPUs (NCCL); this job runs on CPUs.",
                         "implementation 'reproflow' or 'param' with gloo")
    if len(set(ctx.hosts())) > 1:
        raise ParamError(f"implementation 'nccl-tests' runs its single-process binaries on one node (-g <ranks>); "
                         f"this job spans {len(set(ctx.hosts()))}. Run the MPI build across nodes as its own step: "
                         f"srun --mpi=pmix $NCCL_TESTS_DIR/{BINARY[params['collective']]}_mpi -g 1 ...",
                         "launch.nodes = 1")
    binaries()


def argv(params: Mapping[str, Any], world_size: int, binary: Path, json_path: str) -> list[str]:
    """nccl-tests' command line for one point."""
    step = ["-f", str(params["step_factor"])] if params["step_bytes"] == 0 else [
        "-f", "1", "-i", str(params["step_bytes"])]
    return [str(binary), "-b", str(params["begin_size"]), "-e", str(params["end_size"]), *step,
            "-g", str(world_size), "-w", str(params["warmup_iters"]), "-n", str(params["iters"]),
            "-c", "1" if params["check"] else "0", "-z", "1" if params["blocking"] else "0",
            "-d", NCCL_DTYPE[params["dtype"]], "-r", str(params["root"]), "-J", json_path]


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Run the collective's binary for the point's sweep on rank 0 and turn its JSON into rows."""
    binary = binaries() / BINARY[params["collective"]]
    with tempfile.TemporaryDirectory(prefix="nccl-tests-") as tmp:
        json_path = os.path.join(tmp, "result.json")
        result = run_on_rank0(ctx, argv(params, ctx.world_size, binary, json_path))

        def parse() -> NcclRun:
            # The text is checked too and names the nccl-tests version; the JSON holds unrounded figures.
            text = parse_text(result.output)
            if not os.path.exists(json_path):
                raise ToolOutputError(f"{binary.name} wrote no -J file: nccl-tests before 2.18 has no JSON output")
            lowered = reduced_maximum(result.output)
            return NcclRun(parse_json(Path(json_path).read_text(), lowered).rows, text.version)

        parsed = read_output(ctx, parse if ctx.rank == 0 else None, "nccl-tests")
    if parsed is None:
        return []
    placement = "in_place" if params["collective"] in IN_PLACE else "out_of_place"
    tool = {"tool_version": parsed.version, "command": result.command, "placement": placement}
    out: list[Measurement] = []
    for row in parsed.rows:
        t = row.timings[placement]
        coords = {"size_bytes": row.size_bytes, "elements_per_rank": row.count} | tool
        out += [Measurement("time_us", t.time_us, "us", coords), Measurement("algbw", t.algbw, "GB/s", coords),
                Measurement("busbw", t.busbw, "GB/s", coords)]
        if params["check"] and t.wrong is not None:
            out.append(Measurement("wrong_elements", t.wrong, "count", coords))
    return out
