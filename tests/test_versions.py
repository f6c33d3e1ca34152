"""One set of versions: constraints.txt pins every Python package, this environment is exactly it, and the
images install through it (tests/test_containers.py reads the versions inside the built image)."""

from __future__ import annotations

import importlib.metadata
import re
import sysconfig

from conftest import ROOT

# pip (the one each venv starts with) and the project itself are not pinned; setuptools is (torch needs it).
UNPINNED = {"pip", "reproflow"}


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """A version without its local label: torch's 2.13.0+cpu is the lock's 2.13.0 (its CUDA build too)."""
    return version.split("+", 1)[0]


def locked() -> dict[str, str]:
    """constraints.txt as {name: version}; every line must pin one package exactly."""
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;+]*)", line.strip())
        assert match, f"constraints.txt: {line!r} is not name==version"
        name = canonical(match.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = match.group(2)
    return pins


def differences(found: dict[str, str], pins: dict[str, str]) -> list[str]:
    """What `found` (name -> version) has that the lock does not say, one line each."""
    out = [f"{n} {v} is not in constraints.txt" for n, v in sorted(found.items()) if n not in pins]
    out += [f"{n} {v}, constraints.txt says {pins[n]}" for n, v in sorted(found.items())
            if n in pins and public(v) != pins[n]]
    return out


def test_every_line_pins_one_package():
    pins = locked()
    assert {"torch", "numpy", "jinja2", "pandas", "submitit", "deepspeed", "megatron-core", "mpi4py"} <= set(pins)
    assert pins["torch"] == "2.13.0"


def test_the_tests_run_exactly_the_locked_versions():
    # Only what pip installed into this environment: setuptools puts its own vendored copies (jaraco, wheel,
    # ...) on sys.path once something imports it, and those are part of setuptools, not installs.
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions(path=site)}
    installed = {n: v for n, v in installed.items() if n not in UNPINNED}
    pins = locked()
    problems = differences(installed, pins) + [f"{n} {v} is locked but not installed" for n, v in pins.items()
                                                if n not in installed]
    assert not problems, "\n".join(problems) + "\n(make venv installs through constraints.txt; make lock renews it)"


def test_a_version_the_tests_did_not_run_is_named():
    pins = {"torch": "2.13.0", "numpy": "2.4.6"}
    assert differences({"torch": "2.13.0+cu129", "numpy": "2.4.6"}, pins) == []
    assert differences({"torch": "2.4.0a0+f70bd71", "numpy": "1.26.4", "apex": "0.1"}, pins) == [
        "apex 0.1 is not in constraints.txt", "numpy 1.26.4, constraints.txt says 2.4.6",
        "torch 2.4.0a0+f70bd71, constraints.txt says 2.13.0"]
