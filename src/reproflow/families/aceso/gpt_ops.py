"""GPT's ops at Aceso's granularity, each runnable alone on `tp` ranks (Megatron-style tensor parallelism).

Tensors are [sequence, batch, hidden]. An op takes its main input plus the tensors it carries for
later ops (the residual from a layernorm to the next residual add, the attention values from the
score op to the context op) and returns its output plus what it carries on; carried tensors pass
through untouched but count in the input and output sizes, as in Aceso's database. Partition
algorithms: qkv and GEMM-1 are column-parallel with algo 0 and row-parallel with algo 1; dense
and GEMM-2 the other way round. Row-parallel ops take the hidden dimension split over the ranks
and all-reduce their output; the embedding and the output layer split the vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reproflow.families.aceso.models import GPT_LAYER
from reproflow.families.aceso.tp import DROPOUT, BuiltOp, Maker, copy, lm_loss, reduce, vocab_embedding

OPS = ("encoder-embedding", *GPT_LAYER, "final-layernorm", "gpt-post-process")
# Ops between a layernorm and the residual add that closes its block carry the residual.
_RESIDUAL_WINDOW = {
    "enc-1st-layernorm": (False, True), "enc-attention-qkv": (True, True), "enc-attention-score": (True, True),
    "enc-attention-softmax": (True, True), "enc-attention-dropout": (True, True),
    "enc-attention-context": (True, True), "enc-attention-dense": (True, True),
    "enc-post-attention-dropout": (True, False), "enc-2nd-layernorm": (False, True),
    "enc-MLP-GEMM-1": (True, True), "enc-MLP-gelu": (True, True), "enc-MLP-GEMM-2": (True, True),
    "enc-post-MLP-dropout": (True, False),
}
_VALUES_WINDOW = {"enc-attention-score": (False, True), "enc-attention-softmax": (True, True),
                  "enc-attention-dropout": (True, True), "enc-attention-context": (True, False)}


@dataclass(frozen=True)
class Dims:
    seq: int
    hidden: int
    ffn: int
    heads: int
    vocab: int


def build(op: str, d: Dims, mbs: int, tp: int, algo: int, device: torch.device, dtype: torch.dtype) -> BuiltOp:
    """The op `op` with its inputs for micro-batch `mbs` on `tp` ranks with partition `algo`."""
    s, h, b = d.seq, d.hidden, mbs
    heads_local, head_dim = d.heads // tp, h // d.heads

    make = Maker(device, dtype)
    param, act = make.param, make.act

    carry_in, carry_out = _RESIDUAL_WINDOW.get(op, (False, False))
    vals_in, vals_out = _VALUES_WINDOW.get(op, (False, False))
    extra_in: list[torch.Tensor] = []
    if carry_in:
        extra_in.append(act(s, b, h))
    if vals_in:
        extra_in.append(act(s, b * heads_local, head_dim))

    def wrap(main: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
             params: list[torch.nn.Parameter]) -> BuiltOp:
        def forward(x: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = [main(x)]
            rest = list(extra)
            if carry_in and carry_out:
                out.append(rest.pop(0))
            elif carry_out:  # a layernorm starts the window: its input is the residual
                out.append(x)
            elif carry_in:
                rest.pop(0)
            if vals_in and vals_out:
                out.append(rest.pop(0))
            return tuple(out)
        return BuiltOp(forward, [x, *extra_in], params)

    if op == "encoder-embedding":
        embed, ids, params = vocab_embedding(make, d.vocab, h, s, b, tp)
        return BuiltOp(lambda ids_: (embed(ids_),), [ids], params)
    if op in ("enc-1st-layernorm", "enc-2nd-layernorm", "final-layernorm"):
        w, bias = param(h), param(h)
        return wrap(lambda x: F.layer_norm(x, (h,), w, bias), act(s, b, h), [w, bias])
    if op in ("enc-attention-qkv", "enc-MLP-GEMM-1", "enc-attention-dense", "enc-MLP-GEMM-2"):
        n_in, n_out = {"enc-attention-qkv": (h, 3 * h), "enc-MLP-GEMM-1": (h, d.ffn),
                       "enc-attention-dense": (h, h), "enc-MLP-GEMM-2": (d.ffn, h)}[op]
        column = (algo == 0) == (op in ("enc-attention-qkv", "enc-MLP-GEMM-1"))
        if column:  # weight split by output features: full input, split output
            w, bias = param(n_out // tp, n_in), param(n_out // tp)
            return wrap(lambda x: F.linear(copy(x, tp), w, bias), act(s, b, n_in), [w, bias])
        w, bias = param(n_out, n_in // tp), param(n_out)  # row: split input, all-reduced output
        return wrap(lambda x: reduce(F.linear(x, w), tp) + bias, act(s, b, n_in // tp), [w, bias])
    if op == "enc-attention-score":
        def score(x: torch.Tensor) -> torch.Tensor:
            q, k, _ = x.view(s, b * heads_local, 3 * head_dim).split(head_dim, dim=-1)
            return torch.baddbmm(torch.empty(b * heads_local, s, s, device=device, dtype=dtype),
                                 q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2),
                                 beta=0.0, alpha=1.0 / math.sqrt(head_dim))
        return BuiltOp(_with_values(score, s, b * heads_local, head_dim), [act(s, b, 3 * h // tp), *extra_in], [])
    if op == "enc-attention-softmax":
        mask = torch.ones(s, s, device=device, dtype=torch.bool).triu(1)
        return wrap(lambda x: torch.softmax(x.masked_fill(mask, -10000.0), dim=-1),
                    act(b * heads_local, s, s), [])
    if op == "enc-attention-dropout":
        return wrap(lambda x: F.dropout(x, DROPOUT), act(b * heads_local, s, s), [])
    if op == "enc-attention-context":
        def context(x: torch.Tensor, res: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
            c = torch.bmm(x, v.transpose(0, 1))  # [b*nh, s, d]
            return c.transpose(0, 1).reshape(s, b, heads_local * head_dim), res
        return BuiltOp(context, [act(b * heads_local, s, s), *extra_in], [])
    if op in ("enc-post-attention-dropout", "enc-post-MLP-dropout"):
        def add(x: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (F.dropout(x, DROPOUT) + res,)
        return BuiltOp(add, [act(s, b, h), *extra_in], [])
    if op == "enc-MLP-gelu":
        return wrap(F.gelu, act(s, b, d.ffn // tp), [])
    if op == "gpt-post-process":
        loss, params = lm_loss(make, d.vocab, h, s, b, tp)
        return BuiltOp(lambda x: (loss(x),), [act(s, b, h)], params)
    raise ValueError(f"unknown GPT op {op!r}")


def _with_values(score: Callable[[torch.Tensor], torch.Tensor], s: int, bh: int,
                 head_dim: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The score op also hands the attention values on to the context op."""
    def forward(x: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, ...]:
        v = x.view(s, bh, 3 * head_dim)[..., 2 * head_dim:]
        return score(x), res, v
    return forward
