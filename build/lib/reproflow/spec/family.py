"""The one interface every experiment family implements, and the registry that finds them.

A family declares its parameters, a `run` function that executes on every rank of a job and
returns measurements, and a `table` function that formats them the way the original tool does.
Families live in `reproflow.families.<name>` and export `FAMILY`; the engine finds them by name in
that package and imports only the ones it looks up, so a new family needs no change to the engine.
A family's `__init__` declares; what needs torch is imported by its functions when they run, so
listing the families (`reproflow list`, `--help`) imports none of their stacks. A family's own
subcommands live in its `cli` module (`register_cli(subparsers, formatter)`), which only the
command line imports.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from reproflow.spec.errors import ReproflowError
from reproflow.spec.params import Param

if TYPE_CHECKING:
    from reproflow.rank.context import RunContext

AGGREGATE = "all"


@dataclass(frozen=True)
class Measurement:
    """One measured number. `coords` locate it inside a point (message size, GEMM shape, ...).

    `rank` is the rank that measured it, or None for a value aggregated across ranks.
    """

    metric: str
    value: float
    unit: str
    coords: Mapping[str, Any] = field(default_factory=dict)
    rank: int | None = None


RunFn = Callable[["RunContext", Mapping[str, Any]], list[Measurement]]
TableFn = Callable[[Mapping[str, Any], Sequence[Measurement]], str]
CheckFn = Callable[[Mapping[str, Any], int], None]
RuntimeCheckFn = Callable[[Mapping[str, Any], "RunContext"], None]
# The plan of a point when each host runs `host_size` ranks, as text (`reproflow run --explain`).
ExplainFn = Callable[[Mapping[str, Any], int], str]


@dataclass(frozen=True)
class Family:
    """An experiment family: parameters -> run on each rank -> measurements."""

    name: str
    summary: str
    params: tuple[Param, ...]
    run: RunFn
    table: TableFn
    # Cross-parameter checks that need the world size; raise ParamError. Runs on every rank
    # before any collective, so a bad point fails on all ranks alike.
    check: CheckFn | None = None
    # Checks of the job's environment (a tool's checkout, the backend): only at run time, on every
    # rank, before the point's first collective; raise ParamError.
    runtime_check: RuntimeCheckFn | None = None
    explain: ExplainFn | None = None
    # The metric a run of the family is summed up by in `reproflow runs` (its best point's median).
    headline: str = ""
    # Coordinates that number repeated samples of one quantity (an iteration, a step), not conditions
    # like a message size: pooled, not matched, when runs are compared.
    sample_coords: tuple[str, ...] = ()
    # (parameter, metric): the samples a point asks for and the metric with one row per sample; a point
    # with fewer rows of it than asked is not valid (compare, history, the catalog's `invalid`).
    samples: tuple[str, str] | tuple[()] = ()

    def param(self, name: str) -> Param:
        """The declaration of one parameter."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


PACKAGE = "reproflow.families"


def family_names() -> list[str]:
    """The names of the families shipped in `reproflow.families`, found without importing them."""
    package = importlib.import_module(PACKAGE)
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__) if info.ispkg)


@cache
def families() -> dict[str, Family]:
    """All families shipped in `reproflow.families`, by name (each one's declaration only)."""
    return {name: get_family(name) for name in family_names()}


def get_family(name: str) -> Family:
    """The family called `name`, or a ReproflowError listing the known ones."""
    if name.isidentifier():
        # Only its own module: a rank imports the stack of the family it runs, not every family's.
        module_name = f"{PACKAGE}.{name}"
        try:
            fam = getattr(importlib.import_module(module_name), "FAMILY", None)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            fam = None
        if isinstance(fam, Family) and fam.name == name:
            return fam
    raise ReproflowError(f"unknown family '{name}'. Known families: {', '.join(family_names())}.")
