"""User-facing errors: printed as one paragraph by the CLI, never as a traceback."""

from __future__ import annotations


class ReproflowError(Exception):
    """An error caused by the user's input or environment, with the fix in its message."""


class SuiteError(ReproflowError):
    """A suite file that cannot be run: names the file, the field, the bad value and what is allowed."""

    def __init__(self, path: object, field: str, problem: str, allowed: str = "") -> None:
        self.path = str(path)
        self.field = field
        text = f"{self.path}: field '{field}': {problem}"
        if allowed:
            text += f" Allowed: {allowed}."
        super().__init__(text)


class ParamError(ValueError):
    """A parameter value outside what its declaration allows; the caller adds file and field."""

    def __init__(self, problem: str, allowed: str = "") -> None:
        self.problem = problem
        self.allowed = allowed
        super().__init__(problem + (f" Allowed: {allowed}." if allowed else ""))


# A point the hardware cannot measure, or a claim it cannot judge, as its source does: the words
# the worker's log, the reproduce plan's progress and the claims table share.
NOT_APPLICABLE = "not applicable here"


class NotApplicable(Exception):
    """A point this hardware cannot measure as its source does (the message says why and where it can):
    the point is skipped and said so, not failed."""


class PointFailed(Exception):
    """A point that failed on every rank alike (the ranks agreed on it), so the job can go on.

    Raise it only after the ranks agreed, e.g. through RunContext.all_agree; a failure on one rank
    alone must end the job instead, since the other ranks may be waiting in a collective.
    """
