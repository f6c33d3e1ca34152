"""The layers stay apart at run time: what a rank imports, and what the command line's help costs."""

import subprocess
import sys

import pytest

from reproflow.spec.family import family_names

HEAVY = ("torch", "pandas")
PROBE = """
import sys
from reproflow.app.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["--help"], ["list"], *([name, "--help"] for name in ("aceso", "cfp", "resharding",
                                                                                          "spatial"))])
def test_help_and_list_import_neither_torch_nor_pandas(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True, text=True,
                          check=True)
    assert proc.stderr.strip().splitlines()[-1:] in ([], [""]), proc.stderr


@pytest.mark.parametrize("name", family_names())
def test_a_rank_loading_a_family_imports_no_command_line(name: str) -> None:
    code = (f"import sys; from reproflow.spec.family import get_family; get_family({name!r}); "
            "print(','.join(m for m in sys.modules if m.startswith(('reproflow.app', 'reproflow.api', "
            "'reproflow.launch', 'reproflow.reporting')) or m.endswith('.cli')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "", f"loading family {name} imported {proc.stdout.strip()}"
