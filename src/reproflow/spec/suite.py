"""Suites are data: `workflows/*.toml` files, validated completely before anything runs.

Layout of a suite file::

    [suite]                      # name, description, hardware, expected
    [launch]                     # defaults for every experiment (see LAUNCH_FIELDS)
    [[experiment]]
    name = "collectives"
    family = "param_comms"
    launch = { procs_per_node = 4 }
    params = { begin_size = "1K" }               # fixed values
    matrix = { collective = ["all_reduce"] }     # cartesian product
    zip = { a = [1, 2], b = [3, 4] }             # lists taken element by element (outer loop)

Every point of an experiment is one set of resolved parameters.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reproflow.spec.documents import parse, tomllib
from reproflow.spec.errors import ParamError, ReproflowError, SuiteError
from reproflow.spec.family import Family, get_family
from reproflow.spec.params import Param, canonical, resolve

LAUNCHERS = ("torchrun", "mpi")
# Used with fullmatch: `$` would let a trailing newline through into a rendered #SBATCH line.
TIME_RE = re.compile(r"(\d+-)?\d{1,3}:\d{2}:\d{2}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# The results folder's own folders beside the suites' (torn files moved aside, the runs' manifests).
RESULTS_FOLDERS = ("quarantine", "runs")
PARTITION_RE = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
# A Slurm job id as afterok and sacct take it: a job, an array task (1234_5) or a heterogeneous part (1234+1).
JOB_ID_RE = re.compile(r"[0-9]+(?:[_+][0-9]+)?")


def slurm_seconds(limit: str) -> int:
    """Seconds in a Slurm time limit `[D-]HH:MM:SS`."""
    days = 0
    if "-" in limit:
        d, limit = limit.split("-", 1)
        days = int(d)
    h, m, s = (int(x) for x in limit.split(":"))
    return days * 86400 + h * 3600 + m * 60 + s


def format_slurm_time(seconds: int) -> str:
    """A Slurm time limit from seconds: `HH:MM:SS`, or `D-HH:MM:SS` from one day on."""
    days, rest = divmod(int(seconds), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


@dataclass(frozen=True)
class Launch:
    """How an experiment's job is shaped: the same fields drive sbatch, submitit and local runs."""

    nodes: int = 1
    procs_per_node: int = 1
    gpus_per_node: int = 0
    backend: str = "auto"
    device: str = "auto"
    repeats: int = 1
    time_limit: str = "00:30:00"
    timeout_s: float = 600.0
    startup_s: float = 300.0
    partition: str = ""
    exclusive: bool = True
    launcher: str = "torchrun"
    health_gate: bool = True
    network: str = ""

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        return self.nodes * self.procs_per_node


LAUNCH_FIELDS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("nodes", "int", 1, "nodes per job (sbatch -N overrides it on a cluster)", minimum=1, maximum=4096),
        Param("procs_per_node", "int", 1, "ranks per node (one per GPU on clusters)", minimum=1, maximum=1024),
        Param("gpus_per_node", "int", 0, "GPUs requested per node (#SBATCH --gpus-per-node)", minimum=0,
              maximum=64),
        Param("backend", "str", "auto", "torch.distributed backend", choices=("auto", "gloo", "nccl")),
        Param("device", "str", "auto", "where tensors live", choices=("auto", "cpu", "cuda")),
        Param("repeats", "int", 1, "times each point is measured", minimum=1, maximum=1000),
        Param("time_limit", "str", "00:30:00", "Slurm time limit, [D-]HH:MM:SS"),
        Param("timeout_s", "float", 600.0, "seconds before a hung collective fails the job", minimum=10,
              maximum=86400),
        Param("startup_s", "float", 300.0, "seconds each rank has to reach its first point (the interpreter, MPI's "
              "wire-up, the process group, the health gate); past it the ranks are stopped and the run says what "
              "each waited for", minimum=10, maximum=86400),
        Param("partition", "str", "", "Slurm partition (empty: the cluster default)"),
        Param("exclusive", "bool", True, "request whole nodes (#SBATCH --exclusive)"),
        Param("launcher", "str", "torchrun", "how ranks start: torchrun (one per node, it starts the ranks), or "
              "mpi (one MPI rank per process: mpirun here, srun --mpi on Slurm, mpirun_rsh with MVAPICH)",
              choices=LAUNCHERS),
        Param("health_gate", "bool", True, "check the allocation with a short all-reduce before measuring; "
              "points of jobs whose check fails are left out of tables and figures"),
        Param("network", "str", "", "local runs: each emulated host's link, shaped to this bandwidth each way "
              "(e.g. '1gbit'; needs root and iproute2, else the run says so and goes unshaped); '': loopback. "
              "Clusters use their own network"),
    )
}

_TOP_KEYS = {"suite", "launch", "experiment"}
_SUITE_KEYS = {"name", "description", "hardware", "expected", "container"}
_EXPERIMENT_KEYS = {"name", "family", "description", "launch", "params", "matrix", "zip"}


@dataclass(frozen=True)
class Point:
    """One set of resolved parameters of one experiment."""

    suite: str
    experiment: str
    family: str
    params: Mapping[str, Any]
    swept: tuple[str, ...]

    @property
    def label(self) -> str:
        """Human-readable name from the swept values, e.g. `collective=all_reduce`."""
        if not self.swept:
            return "default"
        return ",".join(f"{k}={canonical(self.params[k])}" for k in self.swept)

    def key(self, world_size: int, backend: str, device: str, repeats: int) -> str:
        """File-name-safe identity of the point in one setting; changes when any input changes."""
        ident = json.dumps(
            {
                "params": {k: canonical(v) for k, v in sorted(self.params.items())},
                "world_size": world_size,
                "backend": backend,
                "device": device,
                "repeats": repeats,
            },
            sort_keys=True,
        )
        digest = hashlib.sha256(ident.encode()).hexdigest()[:10]
        slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.label)[:80]
        return f"{slug}-w{world_size}-{device}-{digest}"


@dataclass(frozen=True)
class Experiment:
    """A family with a launch shape and the points it sweeps."""

    name: str
    family: str
    description: str
    launch: Launch
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Suite:
    """A validated suite file."""

    name: str
    path: Path
    description: str
    hardware: str
    expected: str
    experiments: tuple[Experiment, ...] = field(default_factory=tuple)
    container: str = ""

    def experiment(self, name: str) -> Experiment:
        """The experiment called `name`, or a ReproflowError listing the others."""
        for exp in self.experiments:
            if exp.name == name:
                return exp
        names = ", ".join(e.name for e in self.experiments)
        raise ReproflowError(f"suite '{self.name}' has no experiment '{name}'. Its experiments: {names}.")

    def select(self, names: list[str] | None) -> tuple[Experiment, ...]:
        """The named experiments (all when `names` is empty), in file order."""
        if not names:
            return self.experiments
        return tuple(self.experiment(n) for n in names)


def _check_keys(path: Path, where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise SuiteError(path, f"{where}{key}", "is not a known key.", ", ".join(sorted(allowed)))


def _table(path: Path, where: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SuiteError(path, where, f"must be a table, not {type(value).__name__} {value!r}.")
    return value


def parse_launch(path: Path, where: str, table: Mapping[str, Any], base: Launch) -> Launch:
    """Overlay a [launch] table on `base`, validating every field."""
    _check_keys(path, where, table, set(LAUNCH_FIELDS))
    values = {}
    for key, raw in table.items():
        try:
            values[key] = LAUNCH_FIELDS[key].coerce(raw)
        except ParamError as exc:
            raise SuiteError(path, where + key, exc.problem, exc.allowed) from None
    if "time_limit" in values and not TIME_RE.fullmatch(values["time_limit"]):
        raise SuiteError(path, where + "time_limit", f"{values['time_limit']!r} is not a Slurm time.",
                         "[D-]HH:MM:SS, e.g. '00:30:00' or '1-00:00:00'")
    if values.get("partition") and not PARTITION_RE.fullmatch(values["partition"]):
        raise SuiteError(path, where + "partition", f"{values['partition']!r} is not a Slurm partition name.",
                         "letters, digits, '_', '.', '-'; several separated by commas")
    return replace(base, **values)


MAX_POINTS_ENV = "REPROFLOW_MAX_POINTS"


def max_points() -> int:
    """The most points one experiment may sweep: 10,000, or what REPROFLOW_MAX_POINTS says."""
    raw = os.environ.get(MAX_POINTS_ENV, "")
    if not raw:
        return 10_000
    if not raw.isdigit():
        raise ReproflowError(f"{MAX_POINTS_ENV}={raw[:40]!r}: give a whole number of points, or unset it for "
                             "10,000.")
    return int(raw)


def _expand(path: Path, where: str, fam: Family, exp: Mapping[str, Any]) -> list[tuple[dict, tuple[str, ...]]]:
    fixed = dict(_table(path, where + "params", exp.get("params", {})))
    matrix = _table(path, where + "matrix", exp.get("matrix", {}))
    zipped = _table(path, where + "zip", exp.get("zip", {}))
    known = {p.name for p in fam.params}
    for section, table in (("params", fixed), ("matrix", matrix), ("zip", zipped)):
        for key, value in table.items():
            if key not in known:
                raise SuiteError(path, f"{where}{section}.{key}", f"is not a parameter of family '{fam.name}'.",
                                 ", ".join(sorted(known)))
            if section != "params" and (not isinstance(value, list) or not value):
                raise SuiteError(path, f"{where}{section}.{key}", f"must be a non-empty list, not {value!r}.")
            if section == "params" or not isinstance(value, list):
                continue
            for i, item in enumerate(value):
                try:
                    fam.param(key).coerce(item)
                except ParamError as exc:
                    raise SuiteError(path, f"{where}{section}.{key}[{i}]", exc.problem, exc.allowed) from None
    for a, b in (("params", "matrix"), ("params", "zip"), ("matrix", "zip")):
        both = set({"params": fixed, "matrix": matrix, "zip": zipped}[a]) & set(
            {"params": fixed, "matrix": matrix, "zip": zipped}[b]
        )
        if both:
            key = sorted(both)[0]
            raise SuiteError(path, f"{where}{b}.{key}", f"is also set in {where}{a}; set it in one place.")
    lengths = {k: len(v) for k, v in zipped.items()}
    if len(set(lengths.values())) > 1:
        raise SuiteError(path, where + "zip", f"lists must have equal lengths, got {lengths}.")
    sizes = [len(v) for v in matrix.values()] + ([next(iter(lengths.values()))] if lengths else [])
    count, limit = math.prod(sizes), max_points()
    if count > limit:  # counted before a point is built: four 100-value keys would be 10^8 of them
        raise SuiteError(path, where + ("matrix" if matrix else "zip"),
                         f"makes {count:,} points ({' x '.join(map(str, sizes))}), more than {limit:,}.",
                         f"fewer values, or {MAX_POINTS_ENV}=<points> in the environment to allow more")
    zip_rows = [dict(zip(zipped, vals, strict=True)) for vals in zip(*zipped.values(), strict=True)] or [{}]
    matrix_rows = [dict(zip(matrix, vals, strict=True)) for vals in itertools.product(*matrix.values())]
    swept = tuple(matrix) + tuple(zipped)
    # Zipped lists vary slowest: with sizes zipped and implementations in the matrix, the
    # implementations run back to back at each size, so drift on the machine hits them alike.
    return [({**fixed, **m, **z}, swept) for z in zip_rows for m in matrix_rows]


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` strings from --set, values read as TOML (`iters=5`, `end_size="1M"`, `check=false`).

    A value that is not valid TOML is taken as a string, so `end_size=1M` works unquoted.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ReproflowError(f"--set {item!r} is not key=value, e.g. --set iters=5 or --set end_size=1M.")
        try:
            value = parse(f"v = {raw}", toml=True)["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        except ValueError as exc:
            raise ReproflowError(f"--set {key.strip()}: the value cannot be read: {exc}.") from None
        out[key.strip()] = value
    return out


def _apply_overrides(exp: Mapping[str, Any], overrides: Mapping[str, Any], fam: Family) -> dict[str, Any]:
    # An override fixes the parameter for every point. A swept key stays swept with one value, so
    # points keep their labels and result files (`--set collective=reduce` is still that point).
    names = {p.name for p in fam.params}
    out = dict(exp)
    params = dict(exp.get("params", {}))
    matrix = dict(exp.get("matrix", {}))
    zipped = dict(exp.get("zip", {}))
    for key, value in overrides.items():
        if key not in names:
            continue
        if key in matrix or key in zipped:
            zipped.pop(key, None)
            matrix[key] = [value]
        else:
            params[key] = value
    out.update(params=params, matrix=matrix, zip=zipped)
    return out


def load_suite(path: str | Path, overrides: Mapping[str, Any] | None = None, only: str | None = None,
               checks: bool = True) -> Suite:
    """Read and validate a suite file; raise SuiteError naming file, field, value and fix.

    `overrides` (from --set) fix parameters in every experiment whose family declares them. With `only`
    (a rank, which runs one experiment), the family's checks run on that experiment's points alone;
    without `checks` (listing), none run, so no family's stack is imported.
    """
    path = Path(path)
    overrides = dict(overrides or {})
    try:
        if not path.is_file():
            raise ReproflowError(f"suite file {str(path)[:200]} does not exist. `reproflow list` shows the suites.")
        data = parse(path.read_text(encoding="utf-8"), toml=True)
    except OSError as exc:
        raise ReproflowError(f"suite file {str(path)[:200]} cannot be read ({exc.strerror}).") from None
    except UnicodeDecodeError as exc:
        raise SuiteError(path, "(encoding)", f"is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(path, "(syntax)", f"is not valid TOML: {exc}.") from None
    except ValueError as exc:
        raise SuiteError(path, "(syntax)", f"cannot be read: {exc}.") from None
    _check_keys(path, "", data, _TOP_KEYS)
    meta = _table(path, "suite", data.get("suite", {}))
    _check_keys(path, "suite.", meta, _SUITE_KEYS)
    for key, value in meta.items():
        if not isinstance(value, str):
            raise SuiteError(path, f"suite.{key}", f"must be a string, not {value!r}.")
    name = meta.get("name", path.stem)
    if not NAME_RE.fullmatch(name):
        raise SuiteError(path, "suite.name", f"{name!r} cannot name a folder or a Slurm job.",
                         "up to 128 letters, digits, '_', '.', '-', starting with a letter or digit")
    if name in RESULTS_FOLDERS:
        raise SuiteError(path, "suite.name", f"{name!r} is a folder every results folder has for itself.",
                         f"any other name ({', '.join(RESULTS_FOLDERS)} are taken)")
    if meta.get("container") and not NAME_RE.fullmatch(meta["container"]):
        raise SuiteError(path, "suite.container", f"{meta['container']!r} is not an image name.",
                         "an image flavour of containers/reproflow.Dockerfile: gpu or cpu")
    base = parse_launch(path, "launch.", _table(path, "launch", data.get("launch", {})), Launch())
    raw_exps = data.get("experiment")
    if not isinstance(raw_exps, list) or not raw_exps:
        raise SuiteError(path, "experiment", "is missing: a suite needs at least one [[experiment]] table.")
    experiments = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_exps):
        where = f"experiment[{i}]."
        exp = _table(path, f"experiment[{i}]", raw)
        _check_keys(path, where, exp, _EXPERIMENT_KEYS)
        for key in ("name", "family"):
            if not isinstance(exp.get(key), str):
                raise SuiteError(path, where + key, f"is required and must be a string, got {exp.get(key)!r}.")
        ename = exp["name"]
        if not NAME_RE.fullmatch(ename) or ename in seen:
            raise SuiteError(path, where + "name", f"{ename!r} is a duplicate or cannot name a folder.",
                             "unique names of letters, digits, '_', '.', '-'")
        seen.add(ename)
        try:
            fam = get_family(exp["family"])
        except ReproflowError as exc:
            raise SuiteError(path, where + "family", str(exc)) from None
        launch = parse_launch(path, where + "launch.", _table(path, where + "launch", exp.get("launch", {})), base)
        for section in ("params", "matrix", "zip"):
            _table(path, where + section, exp.get(section, {}))
        exp = _apply_overrides(exp, overrides, fam)
        points = []
        for given, swept in _expand(path, where, fam, exp):
            try:
                params = resolve(fam.params, given)
                if fam.check is not None and checks and only in (None, ename):
                    fam.check(params, launch.world_size)
            except ParamError as exc:
                raise SuiteError(path, where + "params", f"point {given}: {exc.problem}", exc.allowed) from None
            points.append(Point(name, ename, fam.name, params, swept))
        experiments.append(
            Experiment(ename, fam.name, str(exp.get("description", "")), launch, tuple(points))
        )
    used = {p.name for e in experiments for p in get_family(e.family).params}
    for key in overrides:
        if key not in used:
            raise SuiteError(path, f"--set {key}", "is not a parameter of any experiment in this suite.",
                             ", ".join(sorted(used)))
    return Suite(name, path, meta.get("description", ""), meta.get("hardware", ""), meta.get("expected", ""),
                 tuple(experiments), meta.get("container", ""))


def find_suite(name_or_path: str, workflows: Path) -> Path:
    """A suite given by path or by name (`param-comms` -> workflows/param-comms.toml)."""
    given = Path(name_or_path)
    try:
        if given.suffix == ".toml" or given.exists():
            return given
        candidate = workflows / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    except OSError as exc:  # a name longer than a file name can be, say
        raise ReproflowError(f"the suite {name_or_path[:80]!r} cannot be looked up ({exc.strerror}). Give a suite's "
                             "name (`reproflow list` shows them) or its file.") from None
    names = ", ".join(sorted(p.stem for p in workflows.glob("*.toml"))) or "(none)"
    raise ReproflowError(f"no suite named '{name_or_path}' in {workflows}. Suites there: {names}.")


def named_suite(name_or_path: str, sets: list[str] | None = None, checks: bool = True) -> Suite:
    """A suite of the checkout's workflows/ by name (or any suite file by path), with `--set` overrides."""
    from reproflow.spec.paths import project_root

    return load_suite(find_suite(name_or_path, project_root() / "workflows"), parse_overrides(sets or []),
                      checks=checks)


def override_strings(overrides: Mapping[str, Any]) -> list[str]:
    """`--set` strings (`key=value`, the value as TOML) for overrides given as a mapping."""
    return [f"{key}={_toml_value(value)}" for key, value in overrides.items()]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # TOML basic strings escape as JSON does
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def suite_toml(suite: Mapping[str, Any], launch: Mapping[str, Any], experiments: list[Mapping[str, Any]]) -> str:
    """The text of a suite file (the tables `load_suite` reads), for commands that generate suites. A
    launch field given as '' is left out: it takes its default (the string fields whose default is ''
    are the ones a command leaves unset, e.g. `network` for loopback)."""
    text = ["[suite]", *(f"{k} = {_toml_value(v)}" for k, v in suite.items()), "",
            "[launch]", *(f"{k} = {_toml_value(v)}" for k, v in launch.items() if v != "")]
    for exp in experiments:
        text += ["", "[[experiment]]", *(f"{k} = {_toml_value(v)}" for k, v in exp.items())]
    return "\n".join(text) + "\n"
