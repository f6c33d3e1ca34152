"""Documents users hand in (Aceso configs, CFP strategy files, the reference table): JSON, or TOML by the
file's suffix, read and checked field by field.

A shape is a type (`str`, `int`, `float`, `bool`), `Count` (an int >= 1), `Index` (an int >= 0),
a one-element list (a list of that shape), a dict of field shapes (keys ending in '?' may be
absent), `MapOf(shape)` (any keys, values of one shape) or `Either(*shapes)`. `check` raises
ParamError naming the first field that does not fit, so a hand-edited or truncated file gets one
clear sentence instead of a traceback deep in the code that uses it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from reproflow.spec.errors import ParamError


class Count:
    """Shape of a whole number >= 1."""


class Index:
    """Shape of a whole number >= 0."""


class Either:
    """Shape of a value that has one of several shapes (Aceso's num_layers: a count, or ResNet's per-block list)."""

    def __init__(self, *shapes: Any) -> None:
        self.shapes = shapes


class MapOf:
    """Shape of an object whose keys are free and whose values all have one shape."""

    def __init__(self, value: Any) -> None:
        self.value = value


_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false",
          Count: "a whole number >= 1", Index: "a whole number >= 0"}


def _fits(value: Any, shape: type) -> bool:
    if shape is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # true/false are not numbers here
        return False
    if shape is float:
        return isinstance(value, int | float) and value == value and abs(value) != float("inf")
    if shape in (int, Count, Index):
        return isinstance(value, int) and value >= {int: value, Count: 1, Index: 0}[shape]
    return isinstance(value, shape)


def check(doc: Any, shape: Any, where: str = "") -> None:
    """Raise ParamError for the first part of `doc` that does not have `shape`."""
    if isinstance(shape, Either):
        problems = []
        for option in shape.shapes:
            try:
                check(doc, option, where)
                return
            except ParamError as exc:
                problems.append(exc.problem)
        raise ParamError(" Or: ".join(problems))
    if isinstance(shape, MapOf):
        if not isinstance(doc, dict):
            raise ParamError(f"{where or 'the document'} must be a JSON object, not {type(doc).__name__}.")
        for key, item in doc.items():
            check(item, shape.value, f"{where}[{key!r}]")
        return
    if isinstance(shape, dict):
        if not isinstance(doc, dict):
            raise ParamError(f"{where or 'the document'} must be a JSON object, not {type(doc).__name__}.")
        for key, sub in shape.items():
            name = key.rstrip("?")
            if name not in doc:
                if key.endswith("?"):
                    continue
                raise ParamError(f"the field {where + name!r} is missing.")
            check(doc[name], sub, f"{where}{name}")
        return
    if isinstance(shape, list):
        if not isinstance(doc, list):
            raise ParamError(f"the field {where!r} must be a list, not {json.dumps(doc)[:60]}.")
        for i, item in enumerate(doc):
            check(item, shape[0], f"{where}[{i}]")
        return
    if not _fits(doc, shape):
        raise ParamError(f"the field {where!r} must be {_NAMES[shape]}, not {json.dumps(doc)[:60]}.")


# Deeper than any document reproflow reads (a suite's matrix of int-lists is 4 levels), shallow enough
# that nothing recursing over a document runs out of stack.
MAX_DEPTH = 32


def _depth(doc: Any) -> int:
    """How many lists and tables deep `doc` goes (iteratively: it is checked before anything recurses)."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            deepest = max(deepest, depth + 1)
            stack += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def parse(text: str, toml: bool) -> Any:
    """TOML or JSON text as Python data; ValueError with a reason a person can act on for what either
    parser refuses, an integer of more digits than Python converts, and nesting deeper than MAX_DEPTH."""
    try:
        doc = tomllib.loads(text) if toml else json.loads(text)
    except RecursionError:
        raise ValueError(f"it is nested deeper than {MAX_DEPTH} lists or tables") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's 4300-digit limit, whose message suggests raising it
            raise ValueError("it holds an integer of more than 4300 digits") from None
        raise
    if _depth(doc) > MAX_DEPTH:
        raise ValueError(f"it is nested deeper than {MAX_DEPTH} lists or tables")
    return doc


def read(path: Path, what: str, shape: Any) -> dict:
    """The JSON (or, for a .toml file, TOML) object in `path`, checked against `shape`; ParamError saying
    what the file should be."""
    toml = Path(path).suffix == ".toml"
    try:
        text = Path(path).read_text(encoding="utf-8")
        doc = parse(text, toml)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ParamError(f"{path} cannot be read as {'TOML' if toml else 'JSON'} ({exc}).", what) from None
    try:
        check(doc, shape)
    except ParamError as exc:
        raise ParamError(f"{path}: {exc.problem}", what) from None
    return doc
