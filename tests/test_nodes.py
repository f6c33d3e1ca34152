"""`reproflow nodes`: in generated nights of 2-node jobs on changing node pairs, the node whose ranks are
10 % slower is named, with how often and by how much, and written as an --exclude list; in nights without
a slow node none is named, whatever the run-to-run drift and the ranks' different roles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import reproflow
from test_history import write_night

from reproflow.reporting import catalog
from reproflow.reporting.history import Selection
from reproflow.reporting.nodes import residuals, suspects
from reproflow.spec.family import Measurement
from reproflow.store.provenance import Provenance

NODES = [f"node{i}" for i in range(1, 9)]


def write_nights(root: Path, slow: str, seed: int, nights: int = 60) -> list[Path]:
    """A results folder per night: a GEMM-like point on 2 nodes x 4 ranks of the 8, chosen at random, each
    rank's time of 3 repeats; rank r's role costs 1 + r/10, the night drifts 3 %, the repeats 1 %; the
    ranks on `slow` take 10 % longer."""
    rng = np.random.default_rng(seed)
    folders = []
    for night in range(nights):
        pair = sorted(rng.choice(NODES, 2, replace=False), key=NODES.index)
        drift = float(np.exp(rng.normal(0, 0.03)))
        run_id = f"night-{night:03d}"
        prov = Provenance("7", ",".join(pair), 8, "gloo", "cpu", "a CPU", "2.13.0", "", "a" * 40, "", "",
                          run_id=run_id)
        measured = [(repeat, Measurement("time_s", (1 + rank / 10) * drift * (1.10 if pair[rank // 4] == slow else 1)
                                         * float(np.exp(rng.normal(0, 0.01))), "s", {"m": 1024}, rank=rank))
                    for rank in range(8) for repeat in range(3)]
        folders.append(write_night(root, night, {"suite": "compute", "experiment": "gemm", "family": "param_compute",
                                                 "point": "gemm"}, {}, measured, prov))
    return folders


def judged(root: Path, folders: list[Path]):
    index = catalog.connect(root / "index.sqlite")
    catalog.refresh(index, folders)
    return suspects(residuals(index, folders, Selection()), margin=0.02)


def test_the_slow_node_is_named_with_how_often_and_by_how_much(tmp_path):
    table = judged(tmp_path, write_nights(tmp_path, slow="node7", seed=3))
    assert table.loc[table["verdict"] == "suspect", "node"].tolist() == ["node7"], table
    node7 = table[table["node"] == "node7"].iloc[0]
    assert node7["low"] <= 1.10 <= node7["high"] or abs(node7["slowdown"] - 1.10) < 0.02, node7
    assert node7["slowest_in"] == node7["runs"] > 5  # the slowest of its pair every night it ran


@pytest.mark.parametrize("seed", [4, 5])
def test_no_node_is_named_without_a_slow_one(tmp_path, seed):
    table = judged(tmp_path, write_nights(tmp_path, slow="", seed=seed))
    assert len(table) == 8 and not (table["verdict"] == "suspect").any(), table


def test_the_command_writes_the_exclude_list_the_submit_command_takes(tmp_path):
    folders = write_nights(tmp_path, slow="node3", seed=6, nights=30)
    args = [a for f in folders for a in ("--results", str(f))]
    proc = reproflow("nodes", *args, "--out", str(tmp_path / "out"), "--fail-on-suspect")
    assert proc.returncode == 1 and "Suspect: node3. Keep them out: reproflow submit --exclude node3" in proc.stdout
    assert (tmp_path / "out" / "exclude.txt").read_text() == "node3\n"
    dry = reproflow("submit", "param-demo", "--exclude", f"@{tmp_path / 'out' / 'exclude.txt'}", "--dry-run")
    assert dry.returncode == 0 and "#SBATCH --exclude=node3" in dry.stdout, dry.stdout[-800:] + dry.stderr
    bad = reproflow("submit", "param-demo", "--exclude", "node3;rm -rf /", "--dry-run")
    assert bad.returncode != 0 and "--exclude 'node3;rm -rf /' is not a node name" in bad.stderr
