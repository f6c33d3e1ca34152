"""Aceso's model zoo and op granularity: GPT, T5 and Wide-ResNet as lists of ops.

The op is the unit of everything in Aceso: the profiler times each distinct op, a config gives
every op its tensor-parallel size, data-parallel size, partition algorithm and recompute flag,
and the performance model sums ops. A database holds one row per distinct op; the full model
repeats the per-layer rows `num_layers` times (GPT, T5) or lists every op (ResNet).
"""

from __future__ import annotations

from dataclasses import dataclass

MODELS = ("gpt", "t5", "resnet", "scale-layer")

# size: (layers, seq, hidden, ffn, heads, kv_channels, vocab)
GPT = {
    "350M": (24, 2048, 1024, 4096, 16, 64, 51200),
    "1_3B": (24, 2048, 2048, 8192, 32, 64, 51200),
    "2_6B": (32, 2048, 2560, 10240, 32, 80, 51200),
    "6_7B": (32, 2048, 4096, 16384, 32, 128, 51200),
    "13B": (40, 2048, 5120, 20480, 40, 128, 51200),
    "scale-layer": (1, 2048, 512, 2048, 8, 64, 51200),
    "tiny": (4, 256, 256, 1024, 4, 64, 8192),  # not in the reference: profiles on a CPU in seconds
}
# size: (layers, encoder seq, decoder seq, hidden, ffn, heads, kv_channels, vocab)
T5 = {
    "770M": (24, 2048, 512, 1024, 4096, 16, 64, 30592),
    "3B": (24, 2048, 512, 1024, 16384, 32, 128, 30592),
    "6B": (24, 2048, 512, 1024, 32768, 64, 128, 30592),
    "11B": (24, 2048, 512, 1024, 65536, 128, 128, 30592),
    "22B": (48, 2048, 512, 1024, 65536, 128, 128, 30592),
    "tiny": (2, 128, 32, 128, 512, 4, 32, 4096),  # not in the reference: profiles on a CPU in seconds
}
# size: (blocks per stage, base channels, width factor)
RESNET = {
    "250M": ((3, 4, 6, 3), 160, 2),
    "500M": ((3, 4, 6, 3), 224, 2),
    "1B": ((3, 4, 6, 3), 320, 2),
    "2B": ((3, 4, 6, 3), 448, 2),
    "4B": ((3, 4, 6, 3), 640, 2),
    "6_8B": ((3, 4, 6, 3), 320, 16),
    "13B": ((3, 4, 23, 3), 320, 16),
    "tiny": ((1, 1, 1, 1), 16, 2),  # not in the reference: profiles on a CPU in seconds (use a small image)
}

GPT_LAYER = ("enc-1st-layernorm", "enc-attention-qkv", "enc-attention-score", "enc-attention-softmax",
             "enc-attention-dropout", "enc-attention-context", "enc-attention-dense", "enc-post-attention-dropout",
             "enc-2nd-layernorm", "enc-MLP-GEMM-1", "enc-MLP-gelu", "enc-MLP-GEMM-2", "enc-post-MLP-dropout")
T5_ENCODER_LAYER_OPS = 13
T5_DECODER_LAYER_OPS = 21
RESNET_BLOCK_OPS = 8
LAYER_STARTS = ("enc-1st-layernorm",)  # plus every '*-conv1' of a ResNet block


@dataclass(frozen=True)
class Model:
    """One model of the zoo: its name, size and depth, and what the performance model needs to know."""

    name: str
    size: str
    num_layers: int

    @property
    def family(self) -> str:
        """The op set: scale-layer is a GPT."""
        return "gpt" if self.name == "scale-layer" else self.name

    @property
    def fp16(self) -> bool:
        return self.family != "resnet"

    @property
    def memory_ratios(self) -> tuple[int, int]:
        """(master copy, optimizer state) per weight byte: fp16 Adam keeps fp32 copies, ResNet fp32 does not."""
        return (2, 4) if self.fp16 else (0, 2)

    @property
    def algos(self) -> tuple[int, ...]:
        """Partition algorithms profiled: T5 has only the first."""
        return (0,) if self.family == "t5" else (0, 1)

    @property
    def profile_size(self) -> str:
        """The size whose op profiles a model uses (T5-22B reuses 11B's)."""
        return "11B" if (self.family, self.size) == ("t5", "22B") else self.size

    @property
    def file_stem(self) -> str:
        """Prefix of the database files: gpt_1_3B, t5_770M, gpt_scale-layer."""
        return f"gpt_{self.name}" if self.name == "scale-layer" else f"{self.name}_{self.profile_size}"

    def max_tp(self, gpus_per_node: int) -> int:
        return min(gpus_per_node, 4 if (self.name, self.size) in (("gpt", "350M"), ("t5", "220M")) else 8)

    def full_op_list(self, distinct: list[str]) -> list[str]:
        """Every op of the model in order, from the database's distinct ops."""
        if self.family == "gpt":
            return distinct[:1] + distinct[1:14] * self.num_layers + distinct[14:]
        if self.family == "t5":
            enc, dec = T5_ENCODER_LAYER_OPS, T5_DECODER_LAYER_OPS
            return (distinct[:1] + distinct[1:1 + enc] * self.num_layers + distinct[1 + enc:3 + enc]
                    + distinct[3 + enc:3 + enc + dec] * self.num_layers + distinct[3 + enc + dec:])
        return list(distinct)

    def no_recompute(self) -> frozenset[str]:
        """Ops never recomputed (embedding, post-process, the first conv)."""
        return frozenset({"gpt": ("encoder-embedding", "gpt-post-process"),
                          "t5": ("encoder-embedding", "decoder-embedding", "t5-post-process"),
                          "resnet": ("conv1",)}[self.family])

    def tunable(self, op: str) -> bool:
        """Ops with a tensor-parallel form, whose tp/dp and algo the search's op-level tuning may change."""
        if self.family == "resnet":
            return "conv" in op or "downsample" in op
        return op == "encoder-embedding" or any(k in op for k in ("attention-qkv", "attention-dense", "MLP-GEMM"))

    def json_fields(self) -> dict[str, object]:
        """The model part of Aceso's config JSON."""
        if self.family == "resnet":
            blocks, channels, width = RESNET[self.size]
            return {"model_name": "resnet", "model_size": self.size, "num_layers": list(blocks),
                    "in_channels": channels, "width_factor": width}
        if self.family == "gpt":
            _, seq, hidden, _, heads, _, _ = GPT[self.size if self.name == "gpt" else "scale-layer"]
            return {"model_name": "gpt", "model_size": self.size if self.name == "gpt" else "scale-layer",
                    "num_layers": self.num_layers, "seq_length": seq, "max_position_embeddings": seq,
                    "num_attention_heads": heads, "hidden_size": hidden}
        _, enc, dec, hidden, ffn, heads, kv, _ = T5[self.size]
        return {"model_name": "t5", "model_size": self.size, "num_layers": self.num_layers,
                "encoder_seq_length": enc, "decoder_seq_length": dec, "max_position_embeddings": enc,
                "num_attention_heads": heads, "kv_channels": kv, "hidden_size": hidden, "ffn_hidden_size": ffn}


def model(name: str, size: str, num_layers: int | None = None) -> Model:
    """The model `name` at `size`; `num_layers` defaults to the size's depth (required for scale-layer)."""
    tables = {"gpt": GPT, "t5": T5, "resnet": RESNET}
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if name == "scale-layer":
        if num_layers is None:
            raise ValueError("scale-layer needs --num-layers")
        return Model(name, "scale-layer", num_layers)
    if size not in tables[name]:
        raise ValueError(f"{name} has no size {size!r}; known: {', '.join(tables[name])}")
    if num_layers is None:
        num_layers = sum(RESNET[size][0]) if name == "resnet" else tables[name][size][0]
    return Model(name, size, num_layers)


def is_layer_start(op: str) -> bool:
    return op in LAYER_STARTS or "-conv1" in op


# Tensor layout of an op's input or output: R replicas, V partial sums, split counts per tensor dim.
Spec = tuple[int, int, tuple[int, int, int]]


def op_spec(op: str, tp: int, dp: int, algo: int, is_input: bool) -> Spec | None:
    """The layout an op consumes (`is_input`) or produces; None where nothing is exchanged."""
    rep, col, row_dp = (tp, 1, (1, dp, 1)), (1, 1, (1, dp, tp)), (1, 1, (dp, tp, 1))
    if op == "encoder-embedding":
        return None if is_input else rep
    if op in ("enc-1st-layernorm", "enc-2nd-layernorm", "enc-post-attention-dropout", "enc-post-MLP-dropout"):
        return rep
    if op == "final-layernorm":
        return rep if is_input else (tp, 1, (dp, 1, 1))
    if op in ("enc-attention-qkv", "enc-MLP-GEMM-1"):  # algo 0 column-parallel, 1 row-parallel
        return (rep if is_input else col) if algo == 0 else (col if is_input else rep)
    if op in ("enc-attention-dense", "enc-MLP-GEMM-2"):  # algo 0 row-parallel, 1 column-parallel
        return (col if is_input else rep) if algo == 0 else (rep if is_input else col)
    if op == "enc-attention-score":
        return col if is_input else row_dp
    if op in ("enc-attention-softmax", "enc-attention-dropout"):
        return row_dp
    if op == "enc-attention-context":
        return row_dp if is_input else col
    if op == "enc-MLP-gelu":
        return col
    if op == "gpt-post-process":
        return (tp, 1, (dp, 1, 1)) if is_input else None
    if any(k in op for k in ("conv", "downsample", "bn", "relu", "pool", "fc")):
        return (tp, 1, (dp, 1, 1))
    return None


def reshard(produced: Spec | None, needed: Spec | None) -> tuple[str | None, str | None, int]:
    """(forward primitive, backward primitive, group size) that turns `produced` into `needed`."""
    if produced is None or needed is None or produced == needed:
        return None, None, 0
    (r0, v0, d0), (r1, v1, d1) = produced, needed
    if r0 > r1:
        for a, b in zip(d0, d1, strict=True):
            if a < b:
                return "split", "all_gather", r0 // r1
    elif v0 > v1:
        if r0 < r1:
            return "all_reduce", None, v0 // v1
        for a, b in zip(d0, d1, strict=True):
            if a < b:
                return "reduce_scatter", "all_gather", v0 // v1
    else:
        for i, (a, b) in enumerate(zip(d0, d1, strict=True)):
            if a > b:
                if r0 < r1:
                    return "all_gather", "split", a // b
                if any(d0[j] < d1[j] for j in range(3) if j != i):
                    return "all_to_all", "all_to_all", a // b
    return None, None, 0
