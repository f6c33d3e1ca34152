"""Configs as Aceso's JSON, and the Megatron-LM baseline: uniform plans predicted with the same model.

A uniform plan has pp stages of equal layers (GPT: 13 ops a layer, the embedding on the first
stage and the two tail ops on the last), the same tp and dp = GPUs / (pp tp) everywhere, one
micro-batch, and recomputation of every op or none (never the embedding and post-process).
"""

from __future__ import annotations

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


def _stage_op_counts(model: Model, pp: int) -> list[list[int]]:
    """Op counts per stage of every equal-layer split into `pp` stages (T5: each encoder/decoder split)."""
    family, layers = model.family, model.num_layers
    if family == "gpt":
        if layers % pp:
            return []
        counts = [layers // pp * len(GPT_LAYER)] * pp
        counts[0] += 1
        counts[-1] += 2
        return [counts]
    if family == "t5":
        enc, dec = T5_ENCODER_LAYER_OPS, T5_DECODER_LAYER_OPS
        if pp == 1:
            return [[layers * (enc + dec) + 5]]
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
            out.append(counts)
        return out
    counts = [layers // pp * RESNET_BLOCK_OPS] * pp
    counts[0] += 4
    counts[-1] += 2 + (layers - layers // pp * pp) * RESNET_BLOCK_OPS
    return [counts]


@dataclass
class Plan:
    pp: int
    tp: int
    dp: int
    micro_bs: int
    recompute: bool
    config: Config
    prediction: Prediction


def megatron_plans(cost: CostModel, model_ops: list[str], global_bs: int, num_gpus: int, max_tp: int,
                   stages: range) -> list[Plan]:
    """Every uniform plan for these GPUs, predicted; feasible or not (compare memory with the limit)."""
    model, mbs_list = cost.model, cost.db.mbs
    tps = [t for t in (1, 2, 4, 8) if t <= max_tp]
    plans = []
    n = len(model_ops)
    for pp in stages:
        for tp in tps:
            if num_gpus % (pp * tp):
                continue
            dp = num_gpus // (pp * tp)
            for mbs in mbs_list:
                if mbs // dp not in mbs_list or mbs % dp:
                    continue
                for recompute in (True, False):
                    rc = [1 if recompute else 0] * n
                    if model.family != "resnet":
                        rc[0] = rc[-1] = 0
                    for counts in _stage_op_counts(model, pp):
                        config = config_from_counts(model, global_bs, mbs, model_ops, counts, [tp] * n, [dp] * n,
                                                    [0] * n, rc)
                        plans.append(Plan(pp, tp, dp, mbs, recompute, config, cost.predict(config)))
    return plans


def best_feasible(plans: list[Plan], memory_limit: float) -> Plan | None:
    """The fastest plan whose every stage fits `memory_limit` (ties: less memory)."""
    ok = [p for p in plans if p.prediction.max_memory < memory_limit]
    return min(ok, key=lambda p: (p.prediction.iteration_ms, p.prediction.max_memory), default=None)


def megatron_lm_args(d: dict[str, object], train_iters: int = 5) -> list[str]:
    """Megatron-LM's `pretrain_gpt.py` options for a uniform GPT plan in Aceso's JSON (`d`): the same
    tp, pp, per-DP-rank micro-batch, global batch, shape and full recompute, on mock data."""
    if d.get("model_name") != "gpt":
        raise ValueError(f"model_name {d.get('model_name')!r}: only GPT plans map onto Megatron-LM's pretrain_gpt.py")
    tps = {t for stage in d["model_parallel_size_of_each_op"] for t in stage}  # type: ignore[attr-defined]
    dps = {x for stage in d["data_parallel_size_of_each_op"] for x in stage}  # type: ignore[attr-defined]
    if len(tps) != 1 or len(dps) != 1:
        raise ValueError("not a uniform plan: Megatron-LM needs one tp and one dp for every op")
    (tp,), (dp,) = tps, dps
    pp = int(d["num_stages"])  # type: ignore[call-overload]
    mbs = int(d["micro_batch_size"]) // dp  # type: ignore[call-overload]
    _, _, _, ffn, _, _, vocab = GPT[str(d["model_size"])] if d["model_size"] in GPT else GPT["scale-layer"]
    args = [f"--tensor-model-parallel-size={tp}", f"--pipeline-model-parallel-size={pp}",
            f"--num-layers={d['num_layers']}", f"--hidden-size={d['hidden_size']}",
            f"--ffn-hidden-size={ffn}", f"--num-attention-heads={d['num_attention_heads']}",
            f"--seq-length={d['seq_length']}", f"--max-position-embeddings={d['max_position_embeddings']}",
            f"--micro-batch-size={mbs}", f"--global-batch-size={d['global_batch_size']}",
            f"--train-iters={train_iters}", "--lr=1.0e-4", "--fp16", "--mock-data", "--tokenizer-type=NullTokenizer",
            f"--vocab-size={vocab}", "--eval-iters=0", "--log-interval=1", "--log-throughput"]
    if any(any(stage) for stage in d["recompute_ops"]):  # type: ignore[attr-defined]
        args += ["--recompute-granularity=full", "--recompute-method=uniform", "--recompute-num-layers=1"]
    return args


def parse_megatron_log(text: str) -> list[float]:
    """Every `elapsed time per iteration (ms): X` of a Megatron-LM log, in order."""
    return [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", text)]
