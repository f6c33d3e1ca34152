"""User-facing errors: printed as one paragraph by the CLI, never as a traceback."""

from __future__ import annotations

import re


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


# Line breaks and other control characters would end a job script's line (a #SBATCH comment, a command)
# and start another, or rewrite a terminal's screen.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# What a terminal would act on in text printed to it (clear the screen, set the title, move the cursor,
# overwrite a line): every control character but the line break and the tab.
TERMINAL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with what a terminal would act on written as escapes (ESC as \\x1b), and bytes of a name
    that are not UTF-8 as theirs (\\udcff): row values, names and records come from files anyone may have
    written."""
    return TERMINAL.sub(lambda m: ascii(m.group())[1:-1], text)


# The longest value (a path, a name) any command takes: PATH_MAX on Linux.
LONGEST = 4096


def text_problem(value: str) -> str:
    """What keeps `value` from being written into a shell command or a job script once quoted (a control
    character, bytes that are not UTF-8, more than LONGEST characters), or ''."""
    if CONTROL.search(value):
        return "holds a line break or another control character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "holds bytes that are not UTF-8"
    if len(value) > LONGEST:
        return f"is longer than {LONGEST} characters"
    return ""


def shown(value: str, width: int = 60) -> str:
    """`value` as an error message may print it: escaped, and cut to `width` characters."""
    text = ascii(value)
    return text if len(text) <= width else text[:width - 3] + "..."
