"""Spatial parallelism: tile geometry and layers (fast), then real MPI and gloo runs checked against the
unsplit model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import reproflow

from reproflow.families.spatial import FAMILY
from reproflow.families.spatial.halo import Patch, Span, Window
from reproflow.families.spatial.layers import AvgPool, Conv, MaxPool, Norm
from reproflow.families.spatial.layout import Layout
from reproflow.families.spatial.models import FactorizedReduce, amoebanet_d, resnet_layers, resnet_v2
from reproflow.families.spatial.pipeline import partition, program
from reproflow.spec.errors import ParamError


def test_layers_on_a_whole_image_match_torch():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16, 16)
    whole = Patch.whole(x)
    conv = Conv(4, 6, (1, 7), (1, 2), (0, 3))
    torch.testing.assert_close(conv(whole).data, F.conv2d(x, conv.conv.weight, stride=(1, 2), padding=(0, 3)))
    conv = Conv(4, 6, 3, 2)
    torch.testing.assert_close(conv(whole).data, F.conv2d(x, conv.conv.weight, stride=2, padding=1))
    torch.testing.assert_close(MaxPool(3, 2, 1)(whole).data, F.max_pool2d(x, 3, 2, 1))
    torch.testing.assert_close(MaxPool(2, 2, 0)(whole).data, F.max_pool2d(x, 2, 2))
    for stride in (1, 2):
        torch.testing.assert_close(AvgPool(3, stride, 1)(whole).data,
                                   F.avg_pool2d(x, 3, stride, 1, count_include_pad=False))
    torch.testing.assert_close(Norm(4)(whole).data, F.batch_norm(x, None, None, training=True))
    # AmoebaNet's factorized reduction: conv1(x) beside conv2 on x shifted by one pixel.
    fr = FactorizedReduce(4, 6).eval()
    r = F.relu(x)
    ref = torch.cat([F.conv2d(r, fr.even.conv.weight, stride=2),
                     F.conv2d(F.pad(r[:, :, 1:, 1:], (0, 1, 0, 1)), fr.odd.conv.weight, stride=2)], dim=1)
    torch.testing.assert_close(fr(whole).data, fr.norm.bn(ref))


@pytest.mark.parametrize("window", [Window(3, 1, 1), Window(3, 2, 1), Window(1, 2, 0), Window(1, 2, -1),
                                    Window(7, 1, 3), Window(2, 2, 0)])
def test_window_reads_exactly_what_it_needs(window):
    for lo, hi in ((0, 8), (4, 12), (6, 10)):
        out = Span(lo, hi)
        need = window.needs(out)
        assert window.gives(need) == out
        # One input fewer on either side loses an output.
        assert window.gives(Span(need.lo + 1, need.hi)) != out and window.gives(Span(need.lo, need.hi - 1)) != out


def test_models_have_the_references_layer_counts():
    assert len(resnet_v2(110, 10, 32)) == resnet_layers(110) == 38
    assert len(resnet_v2(29, 10, 32)) == resnet_layers(29) == 11  # `--balance` counts what the model has
    assert len(amoebanet_d(18, 32, 10)) == 24
    assert partition(38, 2, ()) == [range(0, 19), range(19, 38)]
    assert partition(10, 3, ()) == [range(0, 3), range(3, 6), range(6, 10)]
    assert partition(38, 2, (10, 28)) == [range(0, 10), range(10, 38)]
    # halo-D2 groups of 3 blocks inside the first 19 layers: conv, then 18 blocks -> 6 groups.
    assert len(program(resnet_v2(110, 10, 32)[:19], 3)) == 1 + 6


def test_layout_follows_the_references_process_formula():
    assert Layout(2, 1, 4, 1, "square").world == 5
    assert Layout(3, 2, 4, 1, "vertical").world == 9
    assert Layout(2, 1, 4, 2, "square").world == 6
    lay = Layout(3, 1, 4, 2, "horizontal")
    assert [lay.role(r).stage for r in range(lay.world)] == [0, 0, 0, 0, 1, 1, 2, 2]
    assert lay.ranks(2) == [6, 7] and lay.grid() == (4, 1)
    assert "perfect-square" in " ".join(Layout(2, 1, 2, 1, "square").problems(64, 2, 1))
    assert "--spatial-size" in " ".join(Layout(2, 2, 4, 1, "square").problems(64, 2, 1))
    assert "--local-DP" in " ".join(Layout(2, 1, 4, 2, "square").problems(64, 1, 1))
    assert "power of two" in " ".join(Layout(2, 1, 4, 1, "square").problems(96, 2, 1))


def _params(**kw):
    base = {p.name: p.default for p in FAMILY.params}
    return base | kw


def test_bad_points_name_the_option_and_the_fix():
    with pytest.raises(ParamError, match=r"needs 5 processes.*-np 5"):
        FAMILY.check(_params(), 4)
    with pytest.raises(ParamError, match="--balance"):
        FAMILY.check(_params(balance="10,10"), 5)
    with pytest.raises(ParamError, match="--app 1"):
        FAMILY.check(_params(app=1), 5)
    with pytest.raises(ParamError, match="--enable-evaluation"):
        FAMILY.check(_params(precision="fp_16"), 5)
    with pytest.raises(ParamError, match=r"--resnet-depth 30 must be 9n \+ 2"):
        FAMILY.check(_params(resnet_depth=30), 5)
    with pytest.raises(ParamError, match="summing to the model's 11 layers"):  # ResNet-29: 9 blocks + 2
        FAMILY.check(_params(resnet_depth=29, balance="19,19"), 5)
    with pytest.raises(ParamError, match="comma-separated integers"):
        FAMILY.check(_params(balance="a,b"), 5)
    # A tile narrower than a halo-D2 group reads is refused before any rank waits for another.
    with pytest.raises(ParamError, match="wider than the 16x4 tile"):
        FAMILY.check(_params(model="amoebanet", num_layers=3, num_filters=16, image_size=64, slice_method="vertical",
                             halo_d2=True), 5)
    FAMILY.check(_params(), 5)

def test_a_dry_run_leaves_the_results_folder_as_it_found_it(tmp_path):
    """Failed or not, a dry run writes nothing: no generated suite is left, none replaced; layer
    parallelism alone (spatial_size 0), as the family's parameters offer it, is a configuration to run."""
    results = tmp_path / "r"
    proc = reproflow("spatial", "resnet", "--num-spatial-parts", "4,2", "--dry-run", "--results", str(results))
    assert proc.returncode != 0 and "same count" in proc.stderr and "Traceback" not in proc.stderr
    assert not results.exists()
    results.mkdir()
    kept = results / "spatial-resnet-32-b32-s2x0-p4.toml"
    kept.write_text("# the suite a real run wrote\n")
    proc = reproflow("spatial", "resnet", "--spatial-size", "0", "--dry-run", "--results", str(results))
    assert proc.returncode == 0, proc.stderr
    assert "# spatial: 2 local rank(s), 1 point(s)" in proc.stdout  # two partitions, no tiles
    assert [p.name for p in results.iterdir()] == [kept.name] and kept.read_text() == "# the suite a real run wrote\n"


CHECKS = """
[launch]
nodes = 1
launcher = "mpi"
time_limit = "00:20:00"
[[experiment]]
name = "resnet"
family = "spatial"
launch = { procs_per_node = 5 }
params = { model = "resnet", resnet_depth = 29, image_size = 64, batch_size = 2, fused_layers = 2, steps = 1 }
matrix = { slice_method = ["square", "vertical", "horizontal"], halo_d2 = [false, true] }
[[experiment]]
name = "resnet-unsplit"
family = "spatial"
launch = { procs_per_node = 2 }
params = { model = "resnet", resnet_depth = 29, image_size = 64, batch_size = 2, spatial_size = 0, steps = 1 }
[[experiment]]
name = "amoebanet"
family = "spatial"
launch = { procs_per_node = 5 }
params = { model = "amoebanet", num_layers = 3, num_filters = 16, image_size = 128, batch_size = 2, steps = 1 }
matrix = { slice_method = ["square", "vertical", "horizontal"], halo_d2 = [false, true] }
"""


def _rows(results) -> pd.DataFrame:
    files = sorted(results.rglob("*.csv"))
    assert files
    return pd.concat([pd.read_csv(f, dtype={"rank": str}) for f in files])


def _metric(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    return rows[(rows["metric"] == name) & (rows["rank"] == "all")]


@pytest.mark.distributed
@pytest.mark.slow
def test_every_slicing_matches_the_unsplit_model_over_mpi(tmp_path, write_suite):
    """5 MPI ranks (4 tiles + 1 layer-parallel rank): logits and gradients of one training step equal the
    unsplit model's in fp64, for ResNet and AmoebaNet, square / vertical / horizontal, ± halo-D2."""
    suite = write_suite(CHECKS, "spatial-checks")
    results = tmp_path / "results"
    proc = reproflow("run", str(suite), "--results", str(results), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _rows(results)
    assert len(rows["point"].unique()) == 7 and set(rows["experiment"]) == {"resnet", "resnet-unsplit", "amoebanet"}
    assert (_metric(rows, "logits_max_rel_err")["value"] < 1e-12).all()
    assert (_metric(rows, "grads_max_rel_err")["value"] < 1e-8).all()
    assert len(_metric(rows, "grads_max_rel_err")) == 13
    # halo-D2 exchanges once per group: fewer exchanges than one per convolution and pooling.
    ex = _metric(rows, "halo_exchanges_per_step").set_index(["experiment", "slice_method", "halo_d2"])["value"]
    for model in ("resnet", "amoebanet"):
        for sl in ("square", "vertical", "horizontal"):
            assert 0 < ex[(model, sl, True)] < ex[(model, sl, False)]
    # The exactness claim reads these checks, a case per model and slicing; halo-D2's claim is about speed,
    # which one-step checks do not time.
    from reproflow.reporting.claims import NOT_APPLICABLE, NOT_MEASURED
    from reproflow.reporting.report import family_part

    exact, _, halo = family_part("spatial", "claims").claims(rows, tmp_path)
    assert exact.status == "holds" and len(exact.cases) == 13, exact.record()["cases"]
    assert halo.status in (NOT_APPLICABLE, NOT_MEASURED) and halo.measured is None and halo.target == "spatial-chart"
    # Each tile keeps a quarter of what the unsplit first stage keeps for backward, plus its halos;
    # halo-D2 keeps more (it computes the overlaps of a group twice).
    act = rows[(rows["metric"] == "activation_bytes") & (rows["stage"].astype(float) == 0)]
    unsplit = act[act["experiment"] == "resnet-unsplit"]["value"].max()
    tiles = act[act["experiment"] == "resnet"].groupby(["slice_method", "halo_d2"])["value"].max() / unsplit
    assert ((tiles.xs(False, level="halo_d2") >= 0.25) & (tiles.xs(False, level="halo_d2") < 0.3)).all(), tiles
    assert (tiles.xs(True, level="halo_d2") > tiles.xs(False, level="halo_d2")).all(), tiles
    assert "Mean " in proc.stdout and "images per sec:" in proc.stdout
    again = reproflow("run", str(suite), "--results", str(results))
    assert again.returncode == 0 and again.stdout.count("done earlier, skipped") == 13, \
        again.stdout[-3000:] + again.stderr[-3000:]


MIXED = """
[launch]
nodes = 1
time_limit = "00:20:00"
[[experiment]]
name = "gloo-dp"
family = "spatial"
launch = { procs_per_node = 8, backend = "gloo" }
[experiment.params]
model = "resnet"
resnet_depth = 29
image_size = 64
batch_size = 4
parts = 2
split_size = 3
spatial_size = 1
local_dp = 2
slice_method = "square"
comm_backend = "gloo"
steps = 2
balance = "3,4,4"
[[experiment]]
name = "mpi-two-spatial-stages"
family = "spatial"
launch = { procs_per_node = 9, launcher = "mpi" }
[experiment.params]
model = "amoebanet"
num_layers = 3
num_filters = 16
image_size = 128
batch_size = 2
split_size = 3
spatial_size = 2
slice_method = "square"
halo_d2 = true
steps = 1
[[experiment]]
name = "inference-fp16"
family = "spatial"
launch = { procs_per_node = 5, launcher = "mpi" }
[experiment.params]
model = "resnet"
resnet_depth = 29
image_size = 64
batch_size = 2
slice_method = "vertical"
enable_evaluation = true
precision = "fp_16"
steps = 2
"""


@pytest.mark.distributed
@pytest.mark.slow
def test_local_dp_micro_batches_two_spatial_stages_gloo_and_inference(tmp_path, write_suite):
    """torch.distributed (gloo) instead of MPI with 2 micro-batches and 2 replicas of each layer-parallel
    stage (8 ranks); two spatial stages (9 MPI ranks); fp16 inference: each checked against the unsplit model."""
    suite = write_suite(MIXED, "spatial-mixed")
    results = tmp_path / "results"
    proc = reproflow("run", str(suite), "--results", str(results), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _rows(results)
    logits = _metric(rows, "logits_max_rel_err").set_index("experiment")["value"]
    assert set(logits.index) == {"gloo-dp", "mpi-two-spatial-stages", "inference-fp16"}
    assert (logits < 1e-12).all()
    grads = _metric(rows, "grads_max_rel_err").set_index("experiment")["value"]
    assert set(grads.index) == {"gloo-dp", "mpi-two-spatial-stages"} and grads.max() < 1e-8
    ips = _metric(rows, "images_per_s_mean")
    assert len(ips) == 3 and (ips["value"] > 0).all()


# Another MPI job beside: each rank's transports listen (UCX's on 127.0.0.1 and the host's address), then wait.
NEIGHBOUR = ("import sys, time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
             "open(sys.argv[1] + str(MPI.COMM_WORLD.rank), 'w').close(); time.sleep(900)")


def _listening_ports() -> set[int]:
    """Every TCP port something on this machine listens on, on any address."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.slow
@pytest.mark.distributed
def test_the_nine_rank_mpi_experiment_starts_beside_another_mpi_job_every_time(tmp_path, write_suite):
    """A clean-room `make test` once held this suite's 9 MPI ranks at start-up for 15 minutes. The cause:
    MASTER_PORT was a port bound to 0 on 127.0.0.1 and let go, which a neighbouring MPI job's UCX listener
    could hold on the host's address (0.1 % of launches beside 2-3 jobs), so rank 0's store could not
    listen. With a neighbour's listeners up, 20,000 store ports picked as the launcher picks them are free on
    every address (the old pick hit 60 in 50,000 beside 18 such listeners), and the experiment, launched
    again and again beside it, starts and finishes each time."""
    from reproflow.launch.local import find_mpirun
    from reproflow.launch.owner import Owned
    from reproflow.rank.ports import free_port

    suite, results, ready = write_suite(MIXED, "spatial-mixed"), tmp_path / "results", tmp_path / "ready"
    with Owned() as neighbour:
        launcher = subprocess.Popen([find_mpirun(), "-np", "4", sys.executable, "-c", NEIGHBOUR, str(ready)],
                                    env=os.environ | neighbour.env)
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("ready*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        held = _listening_ports()
        taken = held & {free_port() for _ in range(20000)}
        assert not taken, f"store ports picked that something listens on: {sorted(taken)}"
        for _ in range(2):
            proc = reproflow("run", str(suite), "--results", str(results), "-e", "mpi-two-spatial-stages",
                             "--force", timeout=600)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    launcher.wait(timeout=60)  # stopped with its ranks as the context closed


def test_dry_run_shows_the_mpi_launch_and_every_configuration(tmp_path):
    proc = reproflow("spatial", "resnet", "--image-size", "256", "--batch-size", "2", "--compare", "--dry-run",
                     "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "mpirun -np 2 python -m mpi4py -m reproflow.worker" in proc.stdout
    assert "mpirun -np 5 python -m mpi4py -m reproflow.worker" in proc.stdout
    assert proc.stdout.count("halo_d2=") == 6 and not list(tmp_path.iterdir())


def test_speed_up_claim_uses_the_timed_steps_after_the_first_and_leaves_the_checks_out(tmp_path):
    """...of the tiled configuration the suite names for the claim (speedup_claim), not the fastest one."""
    from reproflow.reporting.claims import FAILS, HOLDS, NOT_APPLICABLE, NOT_MEASURED
    from reproflow.reporting.report import family_part

    def rows(experiment, spatial_size, slice_method, verify, seconds, named=False, d2=False):
        return [{"suite": "s", "experiment": experiment, "point": slice_method, "world_size": 5, "backend": "gloo",
                 "device": "cpu", "timestamp": "t", "family": "spatial", "rank": "all", "model": "amoebanet",
                 "spatial_size": spatial_size, "slice_method": slice_method, "halo_d2": d2, "verify": verify,
                 "speedup_claim": named, "epoch": 0.0, "step": float(i), "metric": "step_s", "value": v}
                for i, v in enumerate(seconds)]

    steady = [{"metric": "images_per_s_steady", "step": None, "value": v} for v in (10.0, 20.0)]
    frame = pd.DataFrame(
        rows("layer", 0, "square", False, [5.0, 0.20, 0.21, 0.20, 0.19])  # a slow first step, left out
        + rows("tiles", 1, "vertical", False, [0.30, 0.10, 0.11, 0.10, 0.10], named=True)
        + rows("faster", 1, "horizontal", False, [0.30, 0.05, 0.05, 0.05, 0.05])  # not the one named
        + rows("check", 1, "vertical", True, [0.90]))  # a one-step check of another size: not a timed step
    frame = pd.concat([frame, pd.DataFrame([{**frame.iloc[0].to_dict(), **steady[0]},
                                            {**frame.iloc[5].to_dict(), **steady[1]}])], ignore_index=True)
    claims = family_part("spatial", "claims").claims
    claim = claims(frame, tmp_path)[1]
    assert claim.status == HOLDS and claim.measured == pytest.approx(1.95, rel=0.03), claim
    # 5 ranks on one host of 2 cores take turns on the cores: the ratio is shown, the claim not judged.
    shared = claims(frame.assign(nodelist="vm", host_cpus=2), tmp_path)[1]
    assert shared.status == NOT_APPLICABLE and shared.measured == claim.measured, shared
    assert "5 ranks shared 2 CPU cores" in shared.record()["where"]
    assert claims(frame.assign(nodelist="vm", host_cpus=8), tmp_path)[1].status == HOLDS
    assert claims(frame.assign(nodelist="a,b,c,d,e", host_cpus=2), tmp_path)[1].status == HOLDS  # a rank per host
    # no configuration named before the run: nothing is judged, whichever tiles were fastest
    unnamed = claims(frame.assign(speedup_claim=False), tmp_path)[1]
    assert unnamed.status == NOT_MEASURED and "tiled configuration" in unnamed.detail
    # halo-D2 against the same tiles without it, slicing by slicing: faster on vertical, slower on square
    timed = pd.DataFrame(rows("d2", 1, "vertical", False, [0.3, 0.05, 0.051, 0.05, 0.049], d2=True)
                         + rows("plain", 1, "square", False, [0.3, 0.10, 0.101, 0.10, 0.099])
                         + rows("d2", 1, "square", False, [0.3, 0.20, 0.201, 0.20, 0.199], d2=True))
    halo = claims(pd.concat([frame, timed], ignore_index=True), tmp_path)[2]
    assert [(c.label, c.status) for c in halo.cases] == [("amoebanet square", FAILS), ("amoebanet vertical", HOLDS)]
    assert halo.status == FAILS
