"""Declared parameters of a family: types, defaults, ranges and the size syntax of param/nccl-tests."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reproflow.spec.errors import ParamError

KINDS = ("int", "float", "str", "bool", "size", "int-lists")

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG])?(?:I?B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
_LARGEST = 2**63 - 1  # what torch, numpy and Slurm take as a count or a size


def parse_size(value: object) -> int:
    """Parse a byte size as param does: a plain integer is bytes; K, M, G mean 2^10, 2^20, 2^30.

    `64M`, `64MB` and `64MiB` are all 67108864. Fractions such as `1.5G` are rejected, as in param.
    """
    if isinstance(value, bool):
        raise ParamError(f"{value!r} is not a size.", "bytes as an integer, or an integer with K, M or G")
    if isinstance(value, int):
        if value < 0:
            raise ParamError(f"{value} is negative.", "a size of 0 bytes or more")
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ParamError(
            f"{value!r} is not a size.", "bytes as an integer, or an integer with K, M or G, e.g. '64K', '2G'"
        )
    number, unit = match.groups()
    return int(number) * (_SIZE_UNITS[unit.upper()] if unit else 1)


def format_size(nbytes: int) -> str:
    """Write a byte count the short way (`64M`, `1K`, `12`), the inverse of `parse_size`."""
    for unit in ("G", "M", "K"):
        scale = _SIZE_UNITS[unit]
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def readable_size(nbytes: float, spec: str = "g", iec: bool = False) -> str:
    """`nbytes` in the largest binary unit it reaches, for people: `1.5G`, or with `iec` `1.5 GiB`
    (`spec` formats the number; below 1 KiB the bytes themselves, `12` or `12 B`)."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:{spec}} {unit}iB" if iec else f"{nbytes / scale:{spec}}{unit}"
    return f"{nbytes:g} B" if iec else f"{nbytes:g}"


def whole(minimum: int = 1) -> Callable[[str], int]:
    """argparse type: a whole number from `minimum` up to a 64-bit integer's largest; anything else is
    refused naming the value and the range (`--nodes -2` or `--nodes 0` never mean the default)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value <= _LARGEST:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number >= {minimum}")
        return value
    parse.__name__ = f"whole number >= {minimum}"
    return parse


def number(minimum: float = 0.0) -> Callable[[str], float]:
    """argparse type: a finite number >= `minimum` (nan, inf and 1e400 are refused)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number >= {minimum:g}")
        return value
    parse.__name__ = f"number >= {minimum:g}"
    return parse


@dataclass(frozen=True)
class Param:
    """One declared parameter: a suite may set it; the family receives the coerced value."""

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"parameter {self.name}: kind {self.kind!r} is not one of {KINDS}")

    def allowed(self) -> str:
        """Describe the accepted values, for help texts and error messages."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        text = {
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "bool": "true or false",
            "size": "a size in bytes (integer, or with K, M, G suffix)",
            "int-lists": "a list of integer lists, e.g. [[128, 4096, 4096]]",
        }[self.kind]
        if self.minimum is not None and self.maximum is not None:
            text += f" from {self.minimum:g} to {self.maximum:g}"
        elif self.minimum is not None:
            text += f" >= {self.minimum:g}"
        elif self.maximum is not None:
            text += f" <= {self.maximum:g}"
        return text

    def coerce(self, value: object) -> Any:
        """Return the value in canonical form, or raise ParamError saying what is allowed."""
        out = self._convert(value)
        if self.choices is not None and out not in self.choices:
            raise ParamError(f"{value!r} is not a valid choice.", self.allowed())
        if self.kind in ("int", "float", "size"):
            if not math.isfinite(out):
                raise ParamError(f"{value!r} is not a finite number.", self.allowed())
            if self.kind != "float" and abs(out) > _LARGEST:
                raise ParamError(f"{value!r} does not fit in a 64-bit integer.", self.allowed())
            if self.minimum is not None and out < self.minimum:
                raise ParamError(f"{value!r} is below the minimum.", self.allowed())
            if self.maximum is not None and out > self.maximum:
                raise ParamError(f"{value!r} is above the maximum.", self.allowed())
        return out

    def _convert(self, value: object) -> Any:
        wrong = ParamError(f"{value!r} has the wrong type ({type(value).__name__}).", self.allowed())
        if self.kind == "size":
            return parse_size(value)
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise wrong
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise wrong
            return value
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise wrong
            try:
                return float(value)
            except OverflowError:  # an integer beyond a double's range
                raise ParamError(f"{value!r} is beyond a double's range.", self.allowed()) from None
        if self.kind == "str":
            if not isinstance(value, str):
                raise wrong
            return value
        # int-lists
        if not isinstance(value, Sequence) or isinstance(value, str):
            raise wrong
        rows = []
        for row in value:
            if (
                not isinstance(row, Sequence)
                or isinstance(row, str)
                or not row
                or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in row)
            ):
                raise ParamError(f"{row!r} in {value!r} is not a list of positive integers.", self.allowed())
            rows.append(tuple(row))
        return tuple(rows)


def resolve(params: Sequence[Param], given: Mapping[str, object]) -> dict[str, Any]:
    """Merge given values over the defaults; raise ParamError naming an unknown or bad parameter.

    The ParamError's message starts with the parameter name so callers can point at the field.
    """
    known = {p.name: p for p in params}
    for name in given:
        if name not in known:
            raise ParamError(f"'{name}' is not a parameter of this family.", ", ".join(sorted(known)))
    out: dict[str, Any] = {}
    for p in params:
        raw = given.get(p.name, p.default)
        try:
            out[p.name] = p.coerce(raw)
        except ParamError as exc:
            raise ParamError(f"'{p.name}': {exc.problem}", exc.allowed) from None
    return out


def canonical(value: Any) -> Any:
    """A value as it is written into result rows and point keys (tuples become strings)."""
    if isinstance(value, tuple):
        return ";".join("x".join(str(x) for x in row) if isinstance(row, tuple) else str(row) for row in value)
    return value
