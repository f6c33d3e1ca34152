"""The columns every `make bench` table ends with: what it was measured on and when, which the docs
name beside its figures (tools/docs.py)."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

import pandas as pd

from reproflow.store.provenance import git_commit, machine_name

ROOT = Path(__file__).resolve().parents[1]


def stamp(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the checkout's commit, the processor, the cores this process may use and the time added
    as columns."""
    return frame.assign(git_commit=git_commit(str(ROOT)), device_name=machine_name(),
                        host_cpus=len(os.sched_getaffinity(0)),
                        timestamp=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
