"""Configs as Aceso's JSON, and the Megatron-LM baseline: its plans predicted with the same model.

A uniform plan has pp stages of equal layers (GPT: 13 ops a layer, the embedding on the first
stage and the two tail ops on the last), the same tp and dp = GPUs / (pp tp) everywhere, one
micro-batch, and recomputation of every op or none (never the embedding and post-process). Megatron-LM
also gives its first and last pipeline stages depths of their own; those plans are the grid the
baseline is trained over (`to_train`), the fastest measured of them the baseline.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from reproflow.families.aceso.costmodel import Config, CostModel, Prediction, Stage
from reproflow.families.aceso.models import (
    GPT,
    GPT_LAYER,
    RESNET_BLOCK_OPS,
    T5_DECODER_LAYER_OPS,
    T5_ENCODER_LAYER_OPS,
    Model,
)
from reproflow.spec import documents
from reproflow.spec.documents import Count, Either, Index
from reproflow.spec.errors import ParamError
from reproflow.store.files import atomic_write


def config_from_counts(model: Model, global_bs: int, micro_bs: int, model_ops: list[str], counts: list[int],
                       tp: list[int], dp: list[int], algo: list[int], recompute: list[int]) -> Config:
    """Cut per-op lists into stages of `counts` ops."""
    stages, start = [], 0
    for n in counts:
        end = start + n
        stages.append(Stage(model_ops[start:end], tp[start:end], dp[start:end], algo[start:end],
                            recompute[start:end]))
        start = end
    return Config(model, global_bs, micro_bs, stages)


def to_json(config: Config) -> dict[str, object]:
    """Aceso's config JSON (the runtime's --flexpipe-config)."""
    out = dict(config.model.json_fields())
    out.update(global_batch_size=config.global_bs, micro_batch_size=config.micro_bs,
               num_stages=len(config.stages), num_gpus=[s.num_gpus for s in config.stages],
               checkpoint_activations=[max(s.recompute) > 0 for s in config.stages],
               resharding_stages=[len(set(s.tp)) > 1 or len(set(s.dp)) > 1 or len(set(s.algo)) > 1
                                  for s in config.stages],
               num_ops_in_each_stage=[len(s.ops) for s in config.stages],
               model_parallel_size_of_each_op=[list(s.tp) for s in config.stages],
               data_parallel_size_of_each_op=[list(s.dp) for s in config.stages],
               recompute_ops=[list(s.recompute) for s in config.stages],
               algo_of_each_op=[list(s.algo) for s in config.stages])
    return out


def write_json(config: Config, path: Path) -> None:
    atomic_write(path, json.dumps(to_json(config), indent=4) + "\n")


CONFIG_SHAPE = {"model_name": str, "model_size": str, "num_layers?": Either(Count, [Count]), "global_batch_size": Count,
                "micro_batch_size": Count, "num_gpus": [Count], "num_ops_in_each_stage": [Count],
                "model_parallel_size_of_each_op": [[Count]], "data_parallel_size_of_each_op": [[Count]],
                "algo_of_each_op": [[Index]], "recompute_ops": [[Index]]}
MAX_LAYERS = 4096
PER_OP = ("model_parallel_size_of_each_op", "data_parallel_size_of_each_op", "algo_of_each_op", "recompute_ops")


def read_config(path: Path) -> dict:
    """A config JSON's fields, checked: types, one entry per stage, one per op of each stage."""
    what = "a config JSON in Aceso's format (from `reproflow aceso search`)"
    d = documents.read(path, what, CONFIG_SHAPE)
    counts = d["num_ops_in_each_stage"]
    layers = d.get("num_layers", 1)
    if isinstance(layers, list) and d["model_name"] != "resnet":
        # A list of block depths is Wide-ResNet's; a transformer's depth is one number.
        raise ParamError(f"{path}: the field 'num_layers' of a {d['model_name']} model must be a whole number >= 1, "
                         f"not {layers!r}.", what)
    if (sum(layers) if isinstance(layers, list) else layers) > MAX_LAYERS:
        raise ParamError(f"{path}: 'num_layers' is {d['num_layers']}, more than any model here ({MAX_LAYERS}).", what)
    if not counts:
        raise ParamError(f"{path}: 'num_ops_in_each_stage' is empty.", what)
    for key in ("num_gpus", *PER_OP):
        if len(d[key]) != len(counts):
            raise ParamError(f"{path}: {key!r} has {len(d[key])} stages, 'num_ops_in_each_stage' {len(counts)}.",
                             what)
    for key in PER_OP:
        for s, (ops, n) in enumerate(zip(d[key], counts, strict=True)):
            if len(ops) != n:
                raise ParamError(f"{path}: {key}[{s}] has {len(ops)} entries; the stage has {n} ops.", what)
    return d


def config_digest(path: Path) -> str:
    """What identifies a config whatever its file's name: the hash of its fields (the same plan written
    by Aceso's search and by the Megatron-LM grid has one digest)."""
    return hashlib.sha256(json.dumps(read_config(path), sort_keys=True).encode()).hexdigest()[:12]


def read_json(path: Path, model: Model, model_ops: list[str]) -> Config:
    """A config JSON written by Aceso or reproflow, on the full op list of `model`."""
    d = read_config(path)
    if sum(d["num_ops_in_each_stage"]) != len(model_ops):
        raise ParamError(f"{path}: num_ops_in_each_stage sums to {sum(d['num_ops_in_each_stage'])}; "
                         f"{model.name} has {len(model_ops)} ops.", "one op count per stage summing to the model's")
    flat = lambda key: [x for stage in d[key] for x in stage]  # noqa: E731
    return config_from_counts(model, d["global_batch_size"], d["micro_batch_size"], model_ops,
                              d["num_ops_in_each_stage"], flat("model_parallel_size_of_each_op"),
                              flat("data_parallel_size_of_each_op"), flat("algo_of_each_op"), flat("recompute_ops"))


def layer_splits(layers: int, pp: int, uneven: bool) -> list[tuple[int, ...]]:
    """Layers per stage of every split of `layers` into `pp` stages: equal stages, and with `uneven`
    also Megatron-LM's first and last stages of their own depth (`--decoder-first-pipeline-num-layers`,
    `--decoder-last-pipeline-num-layers`), the stages between them equal; every stage one layer or more."""
    if pp == 1:
        return [(layers,)]
    even = [(layers // pp,) * pp] if layers % pp == 0 else []
    if not uneven:
        return even
    out = []
    for first in range(1, layers):
        for last in range(1, layers - first + 1):
            middle, between = layers - first - last, pp - 2
            if between == 0 and middle == 0:
                out.append((first, last))
            elif between > 0 and middle >= between and middle % between == 0:
                out.append((first, *(middle // between,) * between, last))
    return out


def _stage_op_counts(model: Model, pp: int, uneven: bool = False) -> list[tuple[tuple[int, ...], list[int]]]:
    """(layers per stage, op counts per stage) of every split into `pp` stages (T5: each encoder/decoder
    split, equal layers within each; GPT and Wide-ResNet: `layer_splits`)."""
    family, layers = model.family, model.num_layers
    if family == "t5":
        enc, dec = T5_ENCODER_LAYER_OPS, T5_DECODER_LAYER_OPS
        if pp == 1:
            return [((layers * 2,), [layers * (enc + dec) + 5])]
        out = []
        for split in range(1, pp):
            if layers % split or layers % (pp - split):
                continue
            counts = [layers // split * enc] * split
            counts[0] += 1
            counts[-1] += 1
            counts += [layers // (pp - split) * dec] * (pp - split)
            counts[split] += 1
            counts[-1] += 2
            out.append(((layers // split,) * split + (layers // (pp - split),) * (pp - split), counts))
        return out
    if family == "gpt":
        splits = layer_splits(layers, pp, uneven)
        head, tail, per_layer = 1, 2, len(GPT_LAYER)
    else:  # Wide-ResNet: uniform, the blocks an equal split leaves over on the last stage (the reference's)
        splits = layer_splits(layers, pp, True) if uneven else [
            (*(layers // pp,) * (pp - 1), layers - layers // pp * (pp - 1))]
        head, tail, per_layer = 4, 2, RESNET_BLOCK_OPS
    found = []
    for split in splits:
        counts = [n * per_layer for n in split]
        counts[0] += head
        counts[-1] += tail
        found.append((split, counts))
    return found


def plan_name(pp: int, tp: int, dp: int, micro_bs: int, layers: tuple[int, ...], recompute: bool) -> str:
    """A Megatron-LM plan as a config file's name, the same in every run (no estimate in it)."""
    return (f"megatron_pp{pp}_tp{tp}_dp{dp}_mbs{micro_bs}_layers{'-'.join(map(str, layers))}_"
            f"{'recompute' if recompute else 'norecompute'}.json")


@dataclass
class Plan:
    """A Megatron-LM plan: pipeline, tensor and data parallel sizes, micro-batch (before the data-parallel
    split), full recomputation or none, the layers of each stage, and its prediction."""

    pp: int
    tp: int
    dp: int
    micro_bs: int
    recompute: bool
    config: Config
    prediction: Prediction
    layers: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return plan_name(self.pp, self.tp, self.dp, self.micro_bs, self.layers, self.recompute)

    def describe(self) -> str:
        return (f"pp {self.pp} tp {self.tp} dp {self.dp} micro-batch {self.micro_bs} layers "
                f"{'+'.join(map(str, self.layers))} recompute {'all' if self.recompute else 'none'}")


Shape = tuple[int, int, int, int, bool, tuple[int, ...], list[int]]  # pp, tp, dp, mbs, recompute, layers, counts


def shapes(model: Model, mbs_list: list[int], num_gpus: int, max_tp: int, stages: range,
           uneven: bool = False) -> list[Shape]:
    """Every Megatron-LM plan for these GPUs, before any prediction: without `uneven` the artifact's
    uniform plans (its gen_megatron_plan.py); with it also the first and last stages of their own depth
    that Megatron-LM supports."""
    out: list[Shape] = []
    for pp in stages:
        for tp in (t for t in (1, 2, 4, 8) if t <= max_tp):
            if num_gpus % (pp * tp):
                continue
            dp = num_gpus // (pp * tp)
            for mbs in mbs_list:
                if mbs // dp not in mbs_list or mbs % dp:
                    continue
                for recompute in (True, False):
                    out += [(pp, tp, dp, mbs, recompute, layers, counts)
                            for layers, counts in _stage_op_counts(model, pp, uneven)]
    return out


def megatron_plans(cost: CostModel, model_ops: list[str], global_bs: int, num_gpus: int, max_tp: int,
                   stages: range, uneven: bool = False) -> list[Plan]:
    """`shapes` as configs, predicted; feasible or not (compare memory with the limit)."""
    plans = []
    n = len(model_ops)
    for pp, tp, dp, mbs, recompute, layers, counts in shapes(cost.model, cost.db.mbs, num_gpus, max_tp, stages,
                                                             uneven):
        rc = [1 if recompute else 0] * n
        if cost.model.family != "resnet":
            rc[0] = rc[-1] = 0
        config = config_from_counts(cost.model, global_bs, mbs, model_ops, counts, [tp] * n, [dp] * n, [0] * n, rc)
        plans.append(Plan(pp, tp, dp, mbs, recompute, config, cost.predict(config), layers))
    return plans


def to_train(plans: list[Plan], memory_limit: float) -> list[Plan]:
    """The plans to train to find the fastest: every one predicted to fit `memory_limit`, less full
    recomputation where the same plan fits without it (recomputation repeats each forward and changes
    nothing else, so no Megatron-LM user turns it on where memory allows)."""
    fits = [p for p in plans if p.prediction.max_memory < memory_limit]
    plain = {(p.pp, p.tp, p.dp, p.micro_bs, p.layers) for p in fits if not p.recompute}
    return [p for p in fits if not (p.recompute and (p.pp, p.tp, p.dp, p.micro_bs, p.layers) in plain)]


def pressure_limit(plans: list[Plan]) -> float | None:
    """A per-rank memory limit where recomputation is needed: the least memory any plan needs without
    recomputation (a plan fits below its limit, so none fits without it). It depends on the predicted
    memory alone, which the profile's sizes fix, not on its timings: every run of a database gets the
    same limit. None where no plan with recomputation fits under it."""
    plain = [p.prediction.max_memory for p in plans if not p.recompute]
    limit = min(plain, default=None)
    if limit is None or not any(p.recompute and p.prediction.max_memory < limit for p in plans):
        return None
    return limit


def best_feasible(plans: list[Plan], memory_limit: float) -> Plan | None:
    """The fastest plan whose every stage fits `memory_limit` (ties: less memory)."""
    ok = [p for p in plans if p.prediction.max_memory < memory_limit]
    return min(ok, key=lambda p: (p.prediction.iteration_ms, p.prediction.max_memory), default=None)


def stage_layers(ops: list[int]) -> tuple[int, ...]:
    """The GPT layers of each stage of a plan with `ops` ops a stage (the embedding on the first stage, the
    two tail ops on the last); ValueError where a stage holds part of a layer."""
    inner = [n - (1 if i == 0 else 0) - (2 if i == len(ops) - 1 else 0) for i, n in enumerate(ops)]
    if any(n <= 0 or n % len(GPT_LAYER) for n in inner):
        raise ValueError(f"stages of {ops} ops cut a GPT layer ({len(GPT_LAYER)} ops): Megatron-LM splits whole "
                         "layers")
    return tuple(n // len(GPT_LAYER) for n in inner)


def stage_depth_args(layers: tuple[int, ...]) -> list[str]:
    """Megatron-LM's options for pipeline stages of `layers` layers: none where they are equal; the first
    and last stages' own depths where only they differ (the stages between them equal); ValueError else."""
    if len(set(layers)) <= 1:
        return []
    if len(layers) == 2:  # the last stage takes the layers the first leaves
        return [f"--decoder-first-pipeline-num-layers={layers[0]}"]
    if len(set(layers[1:-1])) > 1:
        raise ValueError(f"stages of {'+'.join(map(str, layers))} layers: Megatron-LM gives only its first and last "
                         "stages depths of their own, the stages between them equal")
    middle = layers[1]
    return [f"--decoder-{end}-pipeline-num-layers={n}" for end, n in (("first", layers[0]), ("last", layers[-1]))
            if n != middle]


def megatron_lm_args(d: dict[str, object], train_iters: int = 5) -> list[str]:
    """Megatron-LM's `pretrain_gpt.py` options for a GPT plan in Aceso's JSON (`d`) that Megatron-LM can
    run: one tp and one dp for every op, its stages' depths (uneven first and last stages included), the
    per-DP-rank micro-batch, global batch, shape and full recompute, on mock data."""
    if d.get("model_name") != "gpt":
        raise ValueError(f"model_name {d.get('model_name')!r}: only GPT plans map onto Megatron-LM's pretrain_gpt.py")
    tps = {t for stage in d["model_parallel_size_of_each_op"] for t in stage}  # type: ignore[attr-defined]
    dps = {x for stage in d["data_parallel_size_of_each_op"] for x in stage}  # type: ignore[attr-defined]
    if len(tps) != 1 or len(dps) != 1:
        raise ValueError("not a uniform plan: Megatron-LM needs one tp and one dp for every op")
    (tp,), (dp,) = tps, dps
    pp = int(d["num_stages"])  # type: ignore[call-overload]
    depths = stage_depth_args(stage_layers(list(d["num_ops_in_each_stage"])))  # type: ignore[call-overload]
    mbs = int(d["micro_batch_size"]) // dp  # type: ignore[call-overload]
    _, _, _, ffn, _, _, vocab = GPT[str(d["model_size"])] if d["model_size"] in GPT else GPT["scale-layer"]
    args = [f"--tensor-model-parallel-size={tp}", f"--pipeline-model-parallel-size={pp}",
            f"--num-layers={d['num_layers']}", f"--hidden-size={d['hidden_size']}",
            f"--ffn-hidden-size={ffn}", f"--num-attention-heads={d['num_attention_heads']}",
            f"--seq-length={d['seq_length']}", f"--max-position-embeddings={d['max_position_embeddings']}",
            f"--micro-batch-size={mbs}", f"--global-batch-size={d['global_batch_size']}",
            f"--train-iters={train_iters}", "--lr=1.0e-4", "--fp16", "--mock-data", "--tokenizer-type=NullTokenizer",
            f"--vocab-size={vocab}", "--eval-iters=0", "--log-interval=1", "--log-throughput", *depths]
    if any(any(stage) for stage in d["recompute_ops"]):  # type: ignore[attr-defined]
        args += ["--recompute-granularity=full", "--recompute-method=uniform", "--recompute-num-layers=1"]
    return args


def parse_megatron_log(text: str) -> list[float]:
    """Every `elapsed time per iteration (ms): X` of a Megatron-LM log, in order."""
    return [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", text)]
