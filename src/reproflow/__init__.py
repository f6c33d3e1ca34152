"""reproflow: reproduce distributed deep-learning systems experiments on Slurm or locally.

The Python API (reproflow.api) is reachable from here: `reproflow.load_suite`, `run_suite`,
`submit_suite` (with a `Job`: how its jobs run), `read_results`, `build_report` and `check_claims`.
It is imported on first use, so the command line starts without pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["Job", "build_report", "check_claims", "load_suite", "read_results", "run_suite", "submit_suite"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # By name: the API sits above every layer, and `reproflow.__version__` must not pull it in.
        return getattr(importlib.import_module("reproflow.api"), name)
    raise AttributeError(f"module 'reproflow' has no attribute {name!r}")
