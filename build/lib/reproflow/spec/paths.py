"""Where the project's data folders are: workflows/, templates/, sbatch/."""

from __future__ import annotations

import os
from pathlib import Path

from reproflow.spec.errors import ReproflowError

_MARKERS = ("workflows", "templates")


def _is_root(path: Path) -> bool:
    return all((path / m).is_dir() for m in _MARKERS)


def project_root() -> Path:
    """The reproflow checkout: $REPROFLOW_ROOT, else the nearest parent of the working directory
    holding workflows/ and templates/, else the checkout this package was installed from."""
    env = os.environ.get("REPROFLOW_ROOT")
    if env:
        if not _is_root(Path(env)):
            raise ReproflowError(f"REPROFLOW_ROOT={env} has no workflows/ and templates/ folders. "
                                 "Point it at a reproflow checkout.")
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for path in (here, *here.parents):
        if _is_root(path):
            return path
    source = Path(__file__).resolve().parents[3]  # src/reproflow/spec/paths.py
    if _is_root(source):
        return source
    raise ReproflowError("cannot find the reproflow checkout (workflows/, templates/). "
                         "Run from inside it or set REPROFLOW_ROOT.")
