from pathlib import Path

import pytest
from conftest import ROOT, reproflow

from reproflow.spec.errors import SuiteError
from reproflow.spec.suite import format_slurm_time, load_suite, slurm_seconds, suite_toml

GOOD = """
[suite]
description = "tiny"
[launch]
backend = "gloo"
[[experiment]]
name = "c"
family = "param_comms"
launch = { procs_per_node = 2 }
params = { begin_size = "1K", end_size = "4K" }
matrix = { collective = ["all_reduce", "broadcast"], dtype = ["float32", "int32"] }
zip = { warmup_iters = [1, 2], iters = [3, 4] }
"""


def test_matrix_times_zip_points(write_suite):
    suite = load_suite(write_suite(GOOD))
    exp = suite.experiments[0]
    assert len(exp.points) == 2 * 2 * 2
    labels = {p.label for p in exp.points}
    assert "collective=all_reduce,dtype=int32,warmup_iters=2,iters=4" in labels
    assert all(p.params["begin_size"] == 1024 for p in exp.points)
    assert exp.launch.procs_per_node == 2 and exp.launch.backend == "gloo"
    keys = {p.key(2, "gloo", "cpu", 1) for p in exp.points}
    assert len(keys) == len(exp.points)
    assert exp.points[0].key(2, "gloo", "cpu", 1) != exp.points[0].key(4, "gloo", "cpu", 1)


def test_every_committed_suite_loads():
    for path in sorted((ROOT / "workflows").glob("*.toml")):
        suite = load_suite(path)
        assert suite.experiments and all(e.points for e in suite.experiments), path


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (("[launch]", "[launch]\nnodez = 2"), "launch.nodez", "not a known key"),
        (('backend = "gloo"', 'backend = "mpi"'), "launch.backend", "'auto', 'gloo', 'nccl'"),
        (("procs_per_node = 2", 'procs_per_node = "2"'), "experiment[0].launch.procs_per_node", "wrong type"),
        (("procs_per_node = 2", "procs_per_node = 0"), "experiment[0].launch.procs_per_node", "below the minimum"),
        (('"broadcast"]', '"alltoall"]'), "experiment[0].matrix.collective[1]", "all_to_all"),
        (('end_size = "4K"', 'end_size = "4X"'), "experiment[0].params", "K, M or G"),
        (('family = "param_comms"', 'family = "nope"'), "experiment[0].family", "param_compute"),
        (('zip = { warmup_iters = [1, 2], iters = [3, 4] }', 'zip = { warmup_iters = [1], iters = [3, 4] }'),
         "experiment[0].zip", "equal lengths"),
        (('params = { begin_size = "1K"', 'params = { collective = "reduce", begin_size = "1K"'),
         "experiment[0].matrix.collective", "set it in one place"),
        (('end_size = "4K"', 'end_size = "512"'), "experiment[0].params", "larger than end_size"),
        (("[launch]", '[launch]\ntime_limit = "90 minutes"'), "launch.time_limit", "HH:MM:SS"),
    ],
)
def test_bad_suites_name_file_field_and_fix(write_suite, change, field, words):
    old, new = change
    assert old in GOOD
    path = write_suite(GOOD.replace(old, new, 1))
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    message = str(err.value)
    assert str(path) in message and f"'{field}'" in message and words in message, message


def test_cli_reports_a_broken_suite_in_one_paragraph(write_suite):
    path = write_suite(GOOD.replace('backend = "gloo"', 'backend = "mpi"'))
    proc = reproflow("run", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert str(path) in proc.stderr and "launch.backend" in proc.stderr and "Allowed" in proc.stderr


def test_toml_syntax_error_is_reported(write_suite):
    proc = reproflow("list", str(write_suite("[suite\n")))
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_suite_lists_the_known_ones():
    proc = reproflow("run", "no-such-suite")
    assert proc.returncode == 2 and "param-demo" in proc.stderr


def test_slurm_times_round_trip():
    assert slurm_seconds("01:02:03") == 3723
    assert slurm_seconds("1-00:00:10") == 86410
    assert format_slurm_time(86410) == "1-00:00:10"
    assert format_slurm_time(2400) == "00:40:00"


def test_list_shows_families_parameters_and_points():
    proc = reproflow("list", "param-demo")
    assert proc.returncode == 0, proc.stderr
    assert "collective=send_recv" in proc.stdout
    proc = reproflow("list")
    assert "param_comms" in proc.stdout and "begin_size = '1K'" in proc.stdout


def test_paths_outside_checkout_still_find_the_project(tmp_path: Path):
    proc = reproflow("list", cwd=tmp_path)
    assert proc.returncode == 0 and "param-demo" in proc.stdout


def test_a_rank_checks_only_its_own_experiment(write_suite):
    """`load_suite(only=...)` (what a rank calls) runs the family's checks on that experiment's points alone;
    without it every point is checked. get_family's one-module import gives the registry's family."""
    from reproflow.spec.family import families, get_family

    path = write_suite("""
        [[experiment]]
        name = "good"
        family = "spatial"
        launch = { procs_per_node = 2 }
        params = { model = "resnet", image_size = 64, batch_size = 2, spatial_size = 0, steps = 1 }
        [[experiment]]
        name = "odd-tiles"
        family = "spatial"
        launch = { procs_per_node = 5 }
        params = { model = "resnet", image_size = 66, batch_size = 2, steps = 1 }
        """)
    with pytest.raises(SuiteError, match=r"experiment\[1\]\.params"):
        load_suite(path)
    with pytest.raises(SuiteError, match=r"experiment\[1\]\.params"):
        load_suite(path, only="odd-tiles")
    assert [e.name for e in load_suite(path, only="good").experiments] == ["good", "odd-tiles"]
    assert all(get_family(name) is fam for name, fam in families().items())


def test_a_generated_suite_leaves_an_empty_launch_field_to_its_default() -> None:
    """suite_toml: `network = ''` (loopback) is left out, a rate is written, and both load."""
    import tomllib

    exp = [{"name": "x", "family": "param_comms", "params": {}}]
    plain = tomllib.loads(suite_toml({"description": "d"}, {"nodes": 2, "network": ""}, exp))
    shaped = tomllib.loads(suite_toml({"description": "d"}, {"nodes": 2, "network": "1gbit"}, exp))
    assert plain["launch"] == {"nodes": 2}
    assert shaped["launch"] == {"nodes": 2, "network": "1gbit"}
