"""The resharding planner against the reference benchmark's decomposition, without running anything."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction as F

import pytest
import torch

from reproflow.families.resharding import FAMILY, balance
from reproflow.families.resharding.cases import N_TO_M, ONE_TO_M
from reproflow.families.resharding.execute import box_values
from reproflow.families.resharding.layout import (
    device_boxes,
    numel,
    parse_mesh,
    parse_spec,
)
from reproflow.families.resharding.plan import LOADBALANCE, make_plan
from reproflow.spec.errors import ParamError
from reproflow.spec.params import resolve

HOST = 4  # ranks per host, as the reference's p3.8xlarge


def params(**given: object) -> dict:
    return resolve(FAMILY.params, given)


def plan(case: str, host_size: int = HOST, **given: object):
    return make_plan(params(case=case, **given), host_size)


# (unit tasks, N senders, M receivers, fractions of the tensor) from the reference's cases.
N_TO_M_DECOMPOSITION = {
    "case1": (2, 4, 4, {F(1, 2)}),
    "case2": (2, 8, 4, {F(1, 2)}),
    "case3": (4, 4, 4, {F(1, 4)}),
    "case4": (64, 1, 1, {F(1, 64)}),
    "case5": (4, 2, 4, {F(1, 4)}),
    "case6": (4, 4, 4, {F(1, 3), F(1, 6)}),
    "case7": (4, 1, 8, {F(1, 4)}),
    "case8": (4, 1, 8, {F(1, 4)}),
    "case9": (4, 4, 4, {F(1, 4)}),
}


@pytest.mark.parametrize("case", sorted(N_TO_M))
def test_n_to_m_decomposition_matches_the_reference(case: str) -> None:
    p = plan(case)
    count, n, m, fractions = N_TO_M_DECOMPOSITION[case]
    assert len(p.tasks) == count
    assert {len(t.senders) for t in p.tasks} == {n}
    assert {len(t.receivers) for t in p.tasks} == {m}
    total = math.prod(p.problem.shape)
    assert {F(numel(t.box), total) for t in p.tasks} == fractions
    assert p.problem.nbytes == total * 4 and total in (2**29, 3072 * 1024 * 170)


def test_case6_slices_are_those_of_the_reference() -> None:
    mib = sorted(t.nbytes / 2**20 for t in plan("case6").tasks)
    assert mib == pytest.approx([340, 340, 680, 680])


@pytest.mark.parametrize("case", sorted(ONE_TO_M))
def test_one_to_m_is_one_task_to_all_receivers(case: str) -> None:
    p = plan(case)
    hosts, devices = (int(x) for x in case.removeprefix("1-to-").split("x"))
    (task,) = p.tasks
    assert task.senders == (0,) and len(task.receivers) == hosts * devices
    assert task.nbytes == 2**30
    broadcast = plan(case, resharding_mode="broadcast")
    assert len(broadcast.transfers) == 1 and broadcast.transfers[0].receivers == task.receivers
    assert len(p.transfers) == hosts * devices  # send_recv: one transfer per receiver


def test_meshes_sit_on_disjoint_hosts_in_reference_order() -> None:
    p = plan("case6")
    assert sorted(p.src_boxes) == list(range(8))  # hosts 0-1, 4 ranks each
    assert sorted(p.dst_boxes) == list(range(8, 20))  # hosts 2-4
    p = plan("1-to-4x2")
    assert sorted(p.src_boxes) == [0]
    assert sorted(p.dst_boxes) == [4, 5, 8, 9, 12, 13, 16, 17]  # devices 0-1 of hosts 1-4


@pytest.mark.parametrize("case", ["case1", "case2", "case3", "case5", "case6", "case9", "1-to-1x2", "1-to-1x4"])
def test_local_allgather_applies_where_the_reference_applies_it(case: str) -> None:
    p = plan(case, use_local_allgather=True)
    assert p.allgather_note.startswith("on")
    assert p.gather_groups and all(len(g) == p.problem.dst_mesh.devices for g in p.gather_groups)
    # Each destination rank receives 1/devices of its tile over the network.
    for rank, box in p.recv_boxes.items():
        assert numel(box) * p.problem.dst_mesh.devices == numel(p.dst_boxes[rank])


@pytest.mark.parametrize("case", ["case4", "case7", "case8", "1-to-1x1", "1-to-1x3", "1-to-2x2", "1-to-3x2",
                                  "1-to-4x2"])
def test_local_allgather_is_left_out_where_the_reference_leaves_it_out(case: str) -> None:
    p = plan(case, use_local_allgather=True)
    assert p.allgather_note.startswith("requested, not applicable")
    assert not p.gather_groups and p.recv_boxes == p.dst_boxes


def test_case1_with_allgather_receives_eighths_from_one_sender_each() -> None:
    p = plan("case1", use_local_allgather=True)
    assert p.recv_spec == "S0,S0"
    assert len(p.tasks) == 8 and {len(t.receivers) for t in p.tasks} == {1}
    assert {len(t.senders) for t in p.tasks} == {4}
    assert p.sent_per_host() == {0: 2**30, 1: 2**30}  # one copy of each half, balanced over the hosts


def test_case9_allgather_rewrite_splits_dim0_within_the_host() -> None:
    assert plan("case9", use_local_allgather=True).recv_spec == "S2,S0"


def every_config() -> list[tuple[str, str, str, bool]]:
    configs = [("send_recv", lb, False) for lb in LOADBALANCE] + [("send_recv", "normal", True)]
    configs += [(mode, lb, False) for mode in ("broadcast", "ring_broadcast") for lb in LOADBALANCE]
    return [(case, *c) for case, c in itertools.product([*N_TO_M, *ONE_TO_M], configs)]


@pytest.mark.parametrize(("case", "mode", "lb", "gather"), every_config())
def test_every_receiver_gets_its_tile_exactly_once(case: str, mode: str, lb: str, gather: bool) -> None:
    p = plan(case, scale=8, resharding_mode=mode, resharding_loadbalance_mode=lb, use_local_allgather=gather)
    got: dict[int, int] = dict.fromkeys(p.recv_boxes, 0)
    for t in p.transfers:
        task = p.tasks[t.task]
        assert t.sender in task.senders and t.sender in p.src_boxes
        if mode == "send_recv":
            assert len(t.receivers) == 1
        else:
            assert t.receivers == task.receivers
        for r in t.receivers:
            got[r] += numel(task.box)
    assert got == {r: numel(b) for r, b in p.recv_boxes.items()}
    # send_recv issues each (receiver, task) once; broadcast each task once.
    expected = sum(len(t.receivers) for t in p.tasks) if mode == "send_recv" else len(p.tasks)
    assert len(p.transfers) == expected


def test_ring_broadcast_chain_follows_the_host_order_from_the_sender() -> None:
    # 1-to-4x2: rank 0 on host 0 sends to 8 ranks on hosts 1-4; the ring visits each host once, in order.
    p = plan("1-to-4x2", scale=8, resharding_mode="ring_broadcast")
    (t,) = p.transfers
    chain = p.chain(t)
    assert chain[0] == t.sender == 0 and sorted(chain[1:]) == sorted(t.receivers)
    assert [p.host(r) for r in chain[1:]] == [1, 1, 2, 2, 3, 3, 4, 4]
    # case7: senders on host 0, 8 receivers on hosts 1 and 2: the chain enters each host once.
    many = plan("case7", scale=8, resharding_mode="ring_broadcast")
    for t in many.transfers:
        hosts = [many.host(r) for r in many.chain(t)]
        assert hosts == sorted(hosts) and hosts[0] == many.host(t.sender)
    assert "rank   0 (host 0) -> 4 -> 5 -> 8 -> 9 -> 12 -> 13 -> 16 -> 17" in p.explain()


def test_sender_choice_per_mode() -> None:
    # case2: each half of the tensor is held by all 8 source ranks (hosts 0 and 1).
    first = plan("case2", resharding_mode="broadcast", resharding_loadbalance_mode="no_loadbalance")
    assert [t.sender for t in first.transfers] == [0, 0]
    # normal balances bytes per device, so the second half leaves from rank 1, on the same host;
    # the solvers balance per host (one NIC each), so the halves leave from different hosts.
    normal = plan("case2", resharding_mode="broadcast", resharding_loadbalance_mode="normal")
    assert [t.sender for t in normal.transfers] == [0, 1]
    for lb in ("loadbalance_size", "loadbalance_order"):
        p = plan("case2", resharding_mode="broadcast", resharding_loadbalance_mode=lb)
        assert sorted(p.sent_per_host()) == [0, 1], lb
    send = plan("case2", resharding_loadbalance_mode="normal")
    assert len({t.sender for t in send.transfers}) == 8  # 8 transfers, least-loaded first: all senders busy


def test_greedy_order_is_deterministic_and_complete() -> None:
    a = plan("case4", resharding_mode="broadcast", resharding_loadbalance_mode="loadbalance_order")
    b = plan("case4", resharding_mode="broadcast", resharding_loadbalance_mode="loadbalance_order")
    assert a.transfers == b.transfers
    assert sorted(t.task for t in a.transfers) == list(range(64))
    other = plan("case4", resharding_mode="broadcast", resharding_loadbalance_mode="loadbalance_order", seed=1)
    assert sorted(t.task for t in other.transfers) == list(range(64))


def brute_force_finish(works: list[balance.Work], n_workers: int) -> int:
    best = None
    for order in itertools.permutations(range(len(works))):
        for senders in itertools.product(*(w.senders for w in works)):
            t = max(balance.finish_times(works, list(senders), list(order), n_workers))
            best = t if best is None else min(best, t)
    return best


def test_search_finds_the_optimal_schedule_of_a_small_problem() -> None:
    # Workers 0-1 send, 2-3 receive; four works of different sizes.
    works = [balance.Work((0, 1), (2,), 4), balance.Work((0,), (3,), 3), balance.Work((0, 1), (3,), 2),
             balance.Work((1,), (2,), 1)]
    senders, order = balance.search_order(works, 4)
    assert sorted(order) == [0, 1, 2, 3]
    assert max(balance.finish_times(works, senders, order, 4)) == brute_force_finish(works, 4)
    senders, order = balance.greedy_order(works, 4, seed=0)
    assert sorted(order) == [0, 1, 2, 3]  # every work issued once
    assert all(s in w.senders for s, w in zip(senders, works, strict=True))  # from a worker that holds it
    # Its first concurrent set is as large as possible: two works, from both senders to both receivers.
    first = order[:2]
    assert {senders[i] for i in first} == {0, 1} and {works[i].receivers for i in first} == {(2,), (3,)}


def test_loadbalance_size_picks_the_least_loaded_sender() -> None:
    works = [balance.Work((0, 1), (2,), 5), balance.Work((0, 1), (2,), 3), balance.Work((0, 1), (2,), 1)]
    assert balance.over_size(works, 3) == ([0, 1, 1], [0, 1, 2])


def test_specs_follow_dtensor_placements() -> None:
    mesh, shape = parse_mesh("2x4", "m"), (4, 8)
    # (Shard(1), Shard(1)): dim 1 split over hosts, then over devices: device (h, d) holds column h*4+d.
    boxes = device_boxes(parse_spec("S1,S1", mesh, shape, "s"), mesh, shape)
    assert [b[1] for b in boxes] == [(i, i + 1) for i in range(8)]
    assert all(b[0] == (0, 4) for b in boxes)
    # (Replicate(), Shard(0)): each host holds the whole tensor, split over its devices.
    boxes = device_boxes(parse_spec("R,S0", mesh, shape, "s"), mesh, shape)
    assert [b[0] for b in boxes] == [(0, 1), (1, 2), (2, 3), (3, 4)] * 2


def test_box_values_are_the_arange() -> None:
    shape = (3, 4, 5)
    full = torch.arange(60, dtype=torch.int32).reshape(shape)
    box = ((1, 3), (0, 2), (2, 5))
    assert torch.equal(box_values(shape, box, torch.device("cpu")), full[1:3, 0:2, 2:5])


@pytest.mark.parametrize(("given", "field"), [
    ({"case": "custom", "src_mesh": "2x4"}, "needs dst_mesh, shape, src_spec, dst_spec"),
    ({"case": "case1", "src_spec": "R,R"}, "only apply to case 'custom'"),
    ({"case": "custom", "src_mesh": "2by4", "dst_mesh": "1x1", "shape": "8", "src_spec": "R,R", "dst_spec": "R,R"},
     "'src_mesh' = '2by4' is not a mesh shape"),
    ({"case": "custom", "src_mesh": "1x2", "dst_mesh": "1x3", "shape": "8x4", "src_spec": "R,S0", "dst_spec": "R,S0"},
     "'dst_spec' = 'R,S0' splits tensor dim 0 (size 8) into 3 parts"),
    ({"case": "custom", "src_mesh": "1x2", "dst_mesh": "1x2", "shape": "8", "src_spec": "S1,R", "dst_spec": "R,R"},
     "'src_spec' = 'S1,R': 'S1' is not R or S<d>"),
    ({"case": "custom", "src_mesh": "1x2", "dst_mesh": "1x2", "shape": "8", "src_spec": "R", "dst_spec": "R,R"},
     "has 1 entries for a 2-D mesh"),
    ({"case": "case6", "scale": 5}, "'scale' = 5 does not divide dim 0 (3072)"),
    ({"case": "case1", "resharding_mode": "broadcast", "use_local_allgather": True},
     "use_local_allgather applies to resharding_mode 'send_recv' only"),
    ({"case": "case1", "runs": 3, "warmup_runs": 3}, "warmup_runs (3) leaves none of the 3 runs"),
])
def test_bad_parameters_name_the_field(given: dict, field: str) -> None:
    with pytest.raises(ParamError, match=None) as err:
        assert FAMILY.check is not None
        FAMILY.check(params(**given), 20)
    assert field in str(err.value)


def test_too_few_ranks_per_host_is_reported() -> None:
    with pytest.raises(ParamError, match="needs 4 ranks per host, the job has 2"):
        plan("case1", host_size=2)
