"""The one interface every experiment family implements, and the registry that finds them.

A family declares its parameters, a `run` function that executes on every rank of a job and
returns measurements, and a `table` function that formats them the way the original tool does.
Families live in `reproflow.families.<name>` and export `FAMILY`; the engine finds them by
scanning that package, so a new family needs no change to the engine.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from reproflow.errors import ReproflowError
from reproflow.params import Param

if TYPE_CHECKING:
    from reproflow.context import RunContext

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
    # Adds the family's own subcommands, `register_cli(subparsers, formatter)`: the reference tool's
    # option names (resharding), or tools beside `run` (aceso search, megatron, ...).
    register_cli: Callable[[argparse._SubParsersAction, type[argparse.HelpFormatter]], None] | None = None

    def param(self, name: str) -> Param:
        """The declaration of one parameter."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


@cache
def families() -> dict[str, Family]:
    """All families shipped in `reproflow.families`, by name."""
    import reproflow.families as pkg

    found: dict[str, Family] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        fam = getattr(module, "FAMILY", None)
        if isinstance(fam, Family):
            found[fam.name] = fam
    return found


def get_family(name: str) -> Family:
    """The family called `name`, or a ReproflowError listing the known ones."""
    if name.isidentifier():
        # Only its own module: a rank imports the stack of the family it runs, not every family's
        # (CFP's DTensor and scipy, Aceso's pandas: seconds per rank).
        module_name = f"reproflow.families.{name}"
        try:
            fam = getattr(importlib.import_module(module_name), "FAMILY", None)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            fam = None
        if isinstance(fam, Family) and fam.name == name:
            return fam
    known = families()
    if name not in known:
        raise ReproflowError(f"unknown family '{name}'. Known families: {', '.join(sorted(known))}.")
    return known[name]
