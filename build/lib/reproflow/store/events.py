"""Progress as events: JSON lines a run appends for whoever supervises it (`reproflow reproduce`),
so that nobody reads progress out of log lines meant for people.

A supervisor names the file in $REPROFLOW_EVENTS for the processes it starts; the ranks (rank 0)
and the launcher append to it: the experiment a rank begins, each point's status, the Slurm jobs
submitted. Without the variable nothing is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from reproflow.store.files import append_line

ENV = "REPROFLOW_EVENTS"
# A point's status: being measured, then one of the others.
RUNNING, MEASURED, SKIPPED, FAILED, NOT_APPLICABLE = "running", "measured", "skipped", "failed", "not_applicable"


def emit(event: str, **fields: Any) -> None:
    """Append one event (`event` and its fields) to $REPROFLOW_EVENTS, if a supervisor set it."""
    path = os.environ.get(ENV)
    if path:
        append_line(Path(path), json.dumps({"event": event, **fields}, default=str))


def read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole events written to `path` after byte `offset`, and the offset after the last of them."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end
