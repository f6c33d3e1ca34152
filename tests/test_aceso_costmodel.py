"""Aceso's performance model on a hand-made database (values worked out by hand below), the database
format round trip, and the Megatron-LM uniform plans on the reference's own miniset database."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reproflow.families.aceso.costmodel import Config, CostModel, Stage
from reproflow.families.aceso.database import (
    OP_COLUMNS,
    PRECISION_FILE,
    op_file,
    read_database,
    write_collective_table,
    write_op_table,
    write_p2p,
)
from reproflow.families.aceso.models import GPT_LAYER, model, op_spec, reshard
from reproflow.families.aceso.pipeline import op_info
from reproflow.families.aceso.plans import best_feasible, megatron_plans, read_json, write_json
from reproflow.families.aceso.report import op_times
from reproflow.spec.errors import ReproflowError

ARTIFACT = Path(__file__).resolve().parents[2] / "shared" / "reference-data" / "aceso"
MINISET, EUROSYS = ARTIFACT / "profiled-time-miniset", ARTIFACT / "profiled-time-eurosys"
DISTINCT = ["encoder-embedding", *GPT_LAYER, "final-layernorm", "gpt-post-process"]


@pytest.fixture
def tiny(tmp_path: Path):
    """A 2-layer GPT database: every op 10 us forward, 20 us backward at tp 1, weights 1 MB,
    activations 2 MB, reserved 3 + 4 MB; layer ops pass 8 MB on, the embedding's input and the
    post-process output are empty. At tp 2 ops take half the time."""
    m = model("scale-layer", "scale-layer", num_layers=2)
    for mbs in (1, 2):
        for tp in (1, 2):
            for algo in (0, 1):
                rows = []
                for op in DISTINCT:
                    size_in = 0.0 if op == "encoder-embedding" else 8.0
                    size_out = 0.0 if op == "gpt-post-process" else 8.0
                    rows.append((op, [10.0 * mbs / tp, 20.0 * mbs / tp, size_in, size_out, 1.0, 2.0, 3.0, 4.0]))
                write_op_table(tmp_path / op_file(m, mbs, tp, algo), rows)
    write_collective_table(tmp_path / "prim_gpt_scale-layer_all_gather_2gpus.csv", [(8, 0.5), (16, 0.9)])
    write_p2p(tmp_path / "p2p_intra_node.csv", [1, 2, 4, 8, 16], [2.0, 4.0, 8.0, 8.0, 8.0])
    db = read_database(tmp_path, m, [1, 2], max_tp=2)
    return m, db, m.full_op_list(db.ops)


def one_tp(ops: list[str], tp: int = 1, dp: int = 1, rc: list[int] | None = None) -> Stage:
    n = len(ops)
    return Stage(list(ops), [tp] * n, [dp] * n, [0] * n, rc or [0] * n)


def test_database_round_trip(tiny, tmp_path: Path) -> None:
    m, db, ops = tiny
    assert db.ops == DISTINCT and len(ops) == 1 + 2 * 13 + 2
    assert (tmp_path / op_file(m, 1, 1, 0)).read_text().splitlines()[0] == ",".join(OP_COLUMNS)
    assert db.collective_ms("all_gather", 2, 8.4) == 0.5  # whole MB, as the reference
    assert db.collective_ms("all_gather", 2, 9.0) == 0.5  # one MB below is accepted
    assert db.collective_ms("all_gather", 2, 12.0) == 100000.0  # missing: prohibitive
    assert db.bandwidth(8.0, cross_node=False) == pytest.approx(0.008)  # 8 MB -> index 2 -> 8 GB/s


def test_one_stage_time_and_pipeline(tiny) -> None:
    m, db, ops = tiny
    cost = CostModel(db, gpus_per_node=4, memory_limit=1e9)
    p = cost.predict(Config(m, 4, 1, [one_tp(ops)]))
    # 29 ops x (10 + 20) us, no P2P (empty input and output): 0.87 ms; 4 micro-batches: 4 x 0.87.
    assert p.stage_ms == pytest.approx([0.87])
    assert p.iteration_ms == pytest.approx(3.48)
    assert p.throughput(4) == pytest.approx(4 / 0.00348)


def test_two_stages_pay_p2p_and_keep_activations_for_the_stage_behind(tiny) -> None:
    m, db, ops = tiny
    cost = CostModel(db, gpus_per_node=4, memory_limit=1e9, shared_space=False)
    p = cost.predict(Config(m, 4, 1, [one_tp(ops[:15]), one_tp(ops[15:])]))
    # Stage 0: 15 x 30 us + 8 MB out at 8 GB/s (1000 us); stage 1: 14 x 30 us + 8 MB in.
    assert p.stage_ms == pytest.approx([1.45, 1.42])
    assert p.pipeline_ms == pytest.approx([3 * 1.45 + 2.87, 3 * 1.42 + 2.87])
    first, last = p.memory
    # Stage 0, one stage behind: weights 15 (+2x master) 45, gradients 15, Adam 60, activations
    # 30 kept for the stage behind, 30 in flight, reserved max(3 + 4, 15) = 15.
    assert (first.weights, first.gradients, first.optimizer, first.activations, first.peak, first.reserved) == \
        pytest.approx((45, 15, 60, 30, 30, 15))
    assert first.total == pytest.approx(195)
    # Stage 1: 14 ops, input 8 MB + activations 28 in flight only, reserved 14.
    assert last.total == pytest.approx(42 + 14 + 56 + 0 + 36 + 14)


def test_a_cpu_profile_reserves_nothing_and_keeps_no_master_copy(tiny, tmp_path: Path) -> None:
    """reproflow's CPU profile (precision.txt: float32) trains in float32 without a caching allocator: no
    master copy and no reserved memory, where the reference's floor of the weights would count them again
    (what the CPU training measures: weights, gradients, Adam's two moments and the saved tensors)."""
    m, _, ops = tiny
    (tmp_path / PRECISION_FILE).write_text("float32\n")
    db = read_database(tmp_path, m, [1, 2], max_tp=2)
    assert db.fp32 and not db.caching_allocator
    first, _ = CostModel(db, gpus_per_node=4, memory_limit=1e9, shared_space=False).predict(
        Config(m, 4, 1, [one_tp(ops[:15]), one_tp(ops[15:])])).memory
    assert (first.weights, first.gradients, first.optimizer, first.activations, first.peak, first.reserved) == \
        pytest.approx((15, 15, 30, 30, 30, 0))


def test_flexible_recompute_takes_the_largest_group_until_it_fits(tiny) -> None:
    m, db, ops = tiny
    cost = CostModel(db, gpus_per_node=4, memory_limit=193, shared_space=False)
    stage = one_tp(ops[:15])
    rc = cost.choose_recompute(stage, micro_bs=1, behind=1)
    # 195 MB > 193: qkv (the first group not starting a layer) and its successor are recomputed;
    # that keeps 2 MB less for the stage behind (x2) and adds a 2 MB recompute peak: 193.
    assert rc == [0, 0, 1, 1] + [0] * 11
    assert cost.stage_memory(stage, 1, 1, rc).total == pytest.approx(193)
    recomputed = Config(m, 4, 1, [one_tp(ops[:15], rc=rc), one_tp(ops[15:])])
    assert cost.predict(recomputed).stage_ms[0] == pytest.approx(1.45 + 0.02)  # two forwards again
    assert CostModel(db, 4, 1e9).choose_recompute(stage, 1, 1) == [0] * 15


def test_shared_storage_rules(tiny) -> None:
    _, db, ops = tiny
    plain = CostModel(db, 4, 1e9, shared_space=False).stage_memory(one_tp(ops[15:]), 1, 0)
    shared = CostModel(db, 4, 1e9).stage_memory(one_tp(ops[15:]), 1, 0)
    # Layer 2 has one softmax (counted 0 instead of 2 MB) and one attention dropout (3 MB instead of 2).
    assert shared.peak - plain.peak == pytest.approx(-2.0 + 1.0)


def test_tensor_parallel_halves_time_and_reshards_between_layouts(tiny) -> None:
    m, db, ops = tiny
    cost = CostModel(db, 4, 1e9)
    t1 = cost.predict(Config(m, 4, 1, [one_tp(ops)])).stage_ms[0]
    t2 = cost.predict(Config(m, 4, 1, [one_tp(ops, tp=2)])).stage_ms[0]
    assert t2 == pytest.approx(t1 / 2)
    # GEMM-1 column-parallel leaves its output split over 2 ranks; GEMM-2 with algo 1 wants it whole:
    # an all-gather of its 8 MB input over 2 ranks (0.5 ms) forwards, a free split backwards.
    mlp = ["enc-2nd-layernorm", "enc-MLP-GEMM-1", "enc-MLP-gelu", "enc-MLP-GEMM-2"]
    stage = Stage(mlp, [2] * 4, [1] * 4, [0, 0, 0, 1], [0] * 4)
    fwd, bwd, cin, cout, _ = cost.stage_time(stage, 2, False, False)
    assert (fwd, bwd) == pytest.approx((4 * 10.0, 4 * 20.0))  # micro-batch 2 at tp 2
    assert cin == pytest.approx(8 / 0.008 + 0.5 * 1000) and cout == pytest.approx(8 / 0.008)
    assert reshard(op_spec("enc-MLP-gelu", 2, 1, 0, False), op_spec("enc-MLP-GEMM-2", 2, 1, 1, True)) \
        == ("all_gather", "split", 2)
    assert reshard(op_spec("enc-MLP-GEMM-2", 2, 1, 0, False), op_spec("enc-post-MLP-dropout", 2, 1, 0, True)) \
        == (None, None, 0)


def test_config_json_round_trip(tiny, tmp_path: Path) -> None:
    m, _, ops = tiny
    config = Config(m, 8, 2, [one_tp(ops[:15], tp=2), one_tp(ops[15:], dp=2)])
    write_json(config, tmp_path / "c.json")
    again = read_json(tmp_path / "c.json", m, ops)
    assert again == config


def test_a_bad_database_names_the_file(tmp_path: Path) -> None:
    m = model("gpt", "1_3B")
    (tmp_path / op_file(m, 1, 1, 0)).write_text("op,fwd\n")
    with pytest.raises(ReproflowError, match=r"header .* is not op_name,forward-compute"):
        read_database(tmp_path, m, [1], 1)
    with pytest.raises(ReproflowError, match=r"no profile .*gpt_1_3B_mbs2_tp1_algo0\.csv"):
        read_database(tmp_path, m, [2], 1)


# The artifact's own gen_megatron_plan.py (scripts/megatron_*_search.sh small | large | scale, run on its
# databases): the fastest feasible uniform plan's predicted iteration (ms), its memory (MB) and shape
# (pp, tp, dp, micro-batch, recompute).
REFERENCE_MEGATRON = {
    ("small", "gpt", "1_3B"): (73654.74, 11704.14, (4, 1, 1, 2, True)),
    ("small", "t5", "770M"): (52169.67, 8268.06, (4, 1, 1, 2, True)),
    ("small", "resnet", "1B"): (20918.91, 14565.83, (4, 1, 1, 8, False)),
    ("large", "gpt", "1_3B"): (126036.04, 24940.83, (1, 2, 2, 2, False)),
    ("large", "gpt", "2_6B"): (111011.27, 24148.13, (4, 2, 1, 1, False)),
    ("large", "gpt", "6_7B"): (112162.90, 26693.08, (2, 4, 2, 2, False)),
    ("large", "gpt", "13B"): (119074.57, 20370.47, (8, 2, 2, 4, True)),
    ("large", "t5", "3B"): (237933.48, 24246.83, (1, 4, 1, 4, True)),
    ("large", "t5", "6B"): (241587.27, 24015.16, (1, 8, 1, 4, True)),
    ("large", "t5", "11B"): (267978.15, 19354.16, (16, 1, 1, 1, True)),
    ("large", "resnet", "2B"): (73185.12, 20300.24, (2, 2, 1, 16, False)),
    ("large", "resnet", "4B"): (90487.25, 25368.00, (1, 8, 1, 16, False)),
    ("large", "resnet", "6_8B"): (83806.54, 21626.10, (1, 8, 2, 32, True)),
    ("large", "resnet", "13B"): (81822.16, 23481.81, (2, 8, 2, 32, True)),
    **{("scale", "scale-layer", f"{n}layers"): row for n, row in (
        (8, (5030.28, 3893.31, (1, 1, 8, 8, False))), (16, (8442.98, 6245.56, (1, 1, 8, 8, False))),
        (32, (14113.74, 17582.02, (2, 1, 4, 8, False))), (64, (28919.15, 20525.10, (1, 1, 8, 8, False))),
        (128, (62652.73, 6196.29, (4, 1, 2, 8, True))), (256, (119785.95, 8872.25, (4, 1, 2, 8, True))),
        (512, (234052.37, 15016.25, (4, 1, 2, 8, True))), (1024, (462585.22, 27612.25, (4, 1, 2, 8, True))))},
}


def _artifact_settings() -> list:
    from reproflow.families.aceso.settings import SETTINGS

    return [pytest.param(name, s, id=f"{name}-{s.model}-{s.label}")
            for name in ("small", "large", "scale") for s in SETTINGS[name] if s.single_gpu is None]


def test_every_artifact_setting_has_a_pinned_plan() -> None:
    assert {(name, s.model, s.label) for name, s in (p.values for p in _artifact_settings())} == set(REFERENCE_MEGATRON)


@pytest.mark.parametrize(("name", "s"), _artifact_settings())
def test_megatron_plans_equal_the_artifacts(name: str, s) -> None:
    """reproflow's Megatron-LM plan under --model reference, with the artifact's settings, is the
    artifact's: the same plan, the same predicted time and memory to the hundredth of a ms and MB."""
    db_path = MINISET if name == "small" else EUROSYS
    if not db_path.is_dir():
        pytest.skip(f"the artifact's database is not at {db_path}")
    m = model(s.model, s.size, s.num_layers)
    gpus = s.nodes * s.gpus_per_node
    db = read_database(db_path, m, list(s.megatron_mbs), m.max_tp(s.gpus_per_node))
    cost = CostModel(db, s.gpus_per_node, s.megatron_memory_limit, kind="reference")
    plans = megatron_plans(cost, m.full_op_list(db.ops), s.global_bs, gpus, m.max_tp(s.gpus_per_node),
                           range(1, min(gpus, 16) + 1))
    best = best_feasible(plans, s.megatron_memory_limit)
    assert best is not None
    ms, mb, shape = REFERENCE_MEGATRON[(name, s.model, s.label)]
    # Sums in another order: the last digit of a value ending in 5 may round the other way.
    assert best.prediction.iteration_ms == pytest.approx(ms, abs=0.006)
    assert best.prediction.max_memory == pytest.approx(mb, abs=0.006)
    assert (best.pp, best.tp, best.dp, best.micro_bs, best.recompute) == shape


@pytest.mark.skipif(not MINISET.is_dir(), reason=f"the reference's miniset database is not at {MINISET}")
def test_profiler_ops_are_the_reference_ops() -> None:
    """The ops the profiler runs are, name for name and in order, those of the reference's files."""
    from reproflow.families.aceso import resnet_ops, transformer_ops
    from reproflow.families.aceso.models import RESNET

    def names(stem: str) -> list[str]:
        return [r.split(",")[0] for r in (MINISET / f"{stem}_mbs1_tp1_algo0.csv").read_text().splitlines()[1:]]

    assert list(transformer_ops.GPT_OPS) == names("gpt_1_3B")
    assert list(transformer_ops.T5_OPS) == names("t5_770M")
    blocks, base, width = RESNET["1B"]
    ops = resnet_ops.op_list(resnet_ops.Dims(blocks, base, width, 224))
    reference = [r.split(",") for r in (MINISET / "resnet_1B_mbs16_tp1_algo0.csv").read_text().splitlines()[1:]]
    assert [o.name for o in ops] == [r[0] for r in reference]
    # The reference's weights (MB, fp32) match these shapes for every convolution.
    weights = {r[0]: float(r[5]) for r in reference}
    for o in ops:
        if o.kind == "conv":
            assert weights[o.name] == pytest.approx(o.kernel**2 * o.c_in * o.c_out * 4 / 2**20, abs=1e-3), o.name
        if o.kind == "downsample" and o.project:
            assert o.carry is not None
            assert weights[o.name] == pytest.approx(o.carry[0] * o.c_out * 4 / 2**20, abs=1e-2), o.name


def _walk_by_loop(starts: list[bool], rc: list[int], act: list[float], share: list[float]) -> tuple[float, float]:
    """The reference's op-by-op walk (`get_activations_v3` / `get_peak_activations`), as a plain loop."""
    saved = segment = peak = 0.0
    n = len(rc)
    for i in range(n - 1):
        if rc[i] and rc[i + 1]:
            a = act[i] * share[i]
            if share[i] != 1.0:
                saved, segment = saved + a, segment + a
                continue
            saved += 0.0 if starts[i + 1] else a
            segment += a
            if starts[i + 1] or i + 1 == n - 1:
                peak, segment = max(peak, segment), 0.0
        elif segment > 0:
            peak, segment = max(peak, segment), 0.0
    return saved, peak


def test_the_recompute_walk_on_arrays_is_the_reference_loop(tiny) -> None:
    """Saved and peak activations of random recompute flags over a stage: the array walk the search
    uses at depth gives the loop's numbers."""
    import random

    _, db, ops = tiny
    cost = CostModel(db, 4, 1e9)
    rng = random.Random(7)
    ids = np.array([db.ops.index(o) for o in ops])
    for _ in range(200):
        act = np.array([rng.choice((0.0, 0.5, 1.0, 2.0, 3.5)) for _ in ops])
        share = np.array([rng.choice((0.0, 1.0, 1.0, 1.5)) for _ in ops])
        rc = [rng.choice((0, 1, 1)) for _ in ops]
        expected = _walk_by_loop([bool(cost.starts[i]) for i in ids], rc, act.tolist(), share.tolist())
        assert cost._saved_and_peak(ids, rc, act, share) == pytest.approx(expected)


def test_gradient_all_reduce_reads_the_profiled_table(tiny, tmp_path: Path) -> None:
    """Inside the table: interpolated; past it: the least-squares line (a noisy table can fall at its
    end); no table for the group: an error naming the file and the fix; across nodes: a ring."""
    m, _, _ = tiny
    write_collective_table(tmp_path / "prim_gpt_scale-layer_all_reduce_4gpus.csv",
                           [(0, 1.0), (1, 6.0), (2, 3.0), (3, 7.0), (4, 6.5)])
    db = read_database(tmp_path, m, [1, 2], max_tp=4)
    assert db.all_reduce_ms(4, 1.5, cross_node=False) == pytest.approx(4.5)
    assert db.all_reduce_ms(4, 28.0, cross_node=False) == pytest.approx(2.3 + 1.2 * 28)  # the fit: 2.3 + 1.2 x
    with pytest.raises(ReproflowError, match=r"prim_gpt_scale-layer_all_reduce_2gpus\.csv: missing.*--model reference"):
        db.all_reduce_ms(2, 8.0, cross_node=False)
    assert db.all_reduce_ms(16, 8.0, cross_node=True) == pytest.approx(2 * 15 / 16 * 8.0 / 0.008 / 1000)


def test_runtime_model_adds_each_messages_fixed_cost(tiny, tmp_path: Path) -> None:
    """The runtime model: a stage's P2P input and output each cost the link's latency beside size /
    bandwidth; without the latency table (a profile from before it) it names the file."""
    m, _, ops = tiny
    for tp in (1, 2):
        (tmp_path / f"opt_gpt_scale-layer_tp{tp}.csv").write_text("op_name,optimizer-step\n" + "".join(
            f"{op},1.0\n" for op in DISTINCT))
    with pytest.raises(ReproflowError, match=r"p2p_latency\.csv: missing.*--model reference"):
        CostModel(read_database(tmp_path, m, [1, 2], max_tp=2), 4, 1e9, kind="runtime")
    (tmp_path / "p2p_latency.csv").write_text("link,latency(us)\nintra,100.0\n")
    db = read_database(tmp_path, m, [1, 2], max_tp=2)
    middle = one_tp(ops[1:15])
    _, _, cin, cout, _ = CostModel(db, 4, 1e9).stage_time(middle, 1, False, False)
    _, _, rin, rout, _ = CostModel(db, 4, 1e9, kind="runtime").stage_time(middle, 1, False, False)
    assert (rin - cin, rout - cout) == pytest.approx((100.0, 100.0))


def test_each_ops_prediction_adds_up_to_its_stage_and_sits_beside_its_measurement(tiny, tmp_path: Path) -> None:
    """op_info writes every op's predicted forward and backward (numbered over the model, as the runtime's
    `<op>#<index>` columns), summing to the cost model's stage terms; the report's op_times sets them
    beside a training's timers and op timers, in ms a micro-batch, the slowest rank of each op."""
    m, db, ops = tiny
    cost, slow = CostModel(db, 4, 1e9), CostModel(db, 4, 1e9)
    rc = [0] * 15
    rc[3] = 1
    config = Config(m, 8, 2, [one_tp(ops[:15], rc=rc), one_tp(ops[15:], tp=2)])
    folder = tmp_path / "aceso" / "search" / "gpt" / "1_3B"
    write_json(config, folder / "c.json")
    op_info(config, {"predicted": cost, "after_training": slow}, folder / "csv" / "ops_c.csv")
    table = pd.read_csv(folder / "csv" / "ops_c.csv")
    assert table["index"].tolist() == list(range(len(ops))) and table["op"].tolist() == ops
    for s, stage in enumerate(config.stages):
        fwd, bwd, *_ = cost.stage_time(stage, config.micro_bs, False, False)
        part = table[table["stage"] == s]
        assert part["predicted_forward_us"].sum() == pytest.approx(fwd)
        assert part["after_training_backward_us"].sum() == pytest.approx(bwd)
    assert table["recompute"].tolist()[:15] == rc and set(table.loc[table["stage"] == 1, "tp"]) == {2}
    # two ranks of stage 0 (their op timers differ: the slower counts), one of stage 1; timers per iteration
    op_columns = {f"{op}#{i}": 10.0 for i, op in enumerate(ops)}
    ranks = [{"stage": "0", "forward-compute": "80", "backward-compute": "120", **op_columns, f"{ops[0]}#0": "30"},
             {"stage": "0", "forward-compute": "60", "backward-compute": "100", **op_columns},
             {"stage": "1", "forward-compute": "40", "backward-compute": "40", **op_columns}]
    out = op_times(tmp_path, "gpt", "1_3B", "c", ranks).set_index(["stage", "part"])
    micro_batches = 8 // 2
    assert out.loc[(0, "forward (timed)"), "measured_ms"] == pytest.approx(80 / micro_batches)
    assert out.loc[(0, "forward (timed)"), "predicted_ms"] == pytest.approx(15 * 20 / 1000)  # 10 us x mbs 2
    # backward with its recomputed op's forward
    assert out.loc[(0, "backward (timed)"), "predicted_ms"] == pytest.approx((15 * 40 + 20) / 1000)
    assert out.loc[(0, ops[0]), "measured_ms"] == pytest.approx(0.03)
    layer_op = ops[1]
    assert out.loc[(0, layer_op), "count"] == ops[:15].count(layer_op)
    assert out.loc[(1, "forward (timed)"), "predicted_ms"] == pytest.approx(len(ops[15:]) * 10 / 1000)  # tp 2
    assert op_times(tmp_path, "gpt", "1_3B", "missing", ranks).empty
