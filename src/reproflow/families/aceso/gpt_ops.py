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
import torch.distributed as dist
import torch.nn.functional as F

from reproflow.families.aceso.models import GPT_LAYER

OPS = ("encoder-embedding", *GPT_LAYER, "final-layernorm", "gpt-post-process")
DROPOUT = 0.1
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


@dataclass
class BuiltOp:
    """One op ready to time: forward(*inputs) -> outputs; `inputs` that need gradients first."""

    forward: Callable[..., tuple[torch.Tensor, ...]]
    inputs: list[torch.Tensor]
    params: list[torch.nn.Parameter]


def _all_reduce(x: torch.Tensor, tp: int) -> torch.Tensor:
    """Sum over the TP ranks, with the matching backward (identity), as Megatron's reduce region."""
    if tp == 1:
        return x
    return _Reduce.apply(x)


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _Copy(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient backward (Megatron's copy-to-TP-region)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def _copy(x: torch.Tensor, tp: int) -> torch.Tensor:
    return x if tp == 1 else _Copy.apply(x)


def build(op: str, d: Dims, mbs: int, tp: int, algo: int, device: torch.device, dtype: torch.dtype) -> BuiltOp:
    """The op `op` with its inputs for micro-batch `mbs` on `tp` ranks with partition `algo`."""
    s, h, b = d.seq, d.hidden, mbs
    heads_local, head_dim = d.heads // tp, h // d.heads

    def param(*shape: int) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.randn(*shape, device=device, dtype=dtype) * 0.02)

    def act(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)

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
        words, pos = param(d.vocab // tp, h), param(s, h)
        ids = torch.randint(0, d.vocab, (s, b), device=device)
        start = dist.get_rank() * (d.vocab // tp) if tp > 1 else 0

        def embed(ids_: torch.Tensor) -> tuple[torch.Tensor, ...]:
            local = ids_ - start
            outside = (local < 0) | (local >= d.vocab // tp)
            e = F.embedding(local.masked_fill(outside, 0), words).masked_fill(outside[..., None], 0.0)
            return (F.dropout(_all_reduce(e, tp) + pos[:, None, :], DROPOUT),)
        return BuiltOp(embed, [ids], [words, pos])
    if op in ("enc-1st-layernorm", "enc-2nd-layernorm", "final-layernorm"):
        w, bias = param(h), param(h)
        return wrap(lambda x: F.layer_norm(x, (h,), w, bias), act(s, b, h), [w, bias])
    if op in ("enc-attention-qkv", "enc-MLP-GEMM-1", "enc-attention-dense", "enc-MLP-GEMM-2"):
        n_in, n_out = {"enc-attention-qkv": (h, 3 * h), "enc-MLP-GEMM-1": (h, d.ffn),
                       "enc-attention-dense": (h, h), "enc-MLP-GEMM-2": (d.ffn, h)}[op]
        column = (algo == 0) == (op in ("enc-attention-qkv", "enc-MLP-GEMM-1"))
        if column:  # weight split by output features: full input, split output
            w, bias = param(n_out // tp, n_in), param(n_out // tp)
            return wrap(lambda x: F.linear(_copy(x, tp), w, bias), act(s, b, n_in), [w, bias])
        w, bias = param(n_out, n_in // tp), param(n_out)  # row: split input, all-reduced output
        return wrap(lambda x: _all_reduce(F.linear(x, w), tp) + bias, act(s, b, n_in // tp), [w, bias])
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
        words = param(d.vocab // tp, h)
        labels = torch.randint(0, d.vocab, (s, b), device=device)

        def loss(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            logits = F.linear(_copy(x, tp), words).float()  # [s, b, V/tp]
            return (_vocab_parallel_ce(logits, labels, d.vocab // tp, tp),)
        return BuiltOp(loss, [act(s, b, h)], [words])
    raise ValueError(f"unknown GPT op {op!r}")


def _with_values(score: Callable[[torch.Tensor], torch.Tensor], s: int, bh: int,
                 head_dim: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The score op also hands the attention values on to the context op."""
    def forward(x: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, ...]:
        v = x.view(s, bh, 3 * head_dim)[..., 2 * head_dim:]
        return score(x), res, v
    return forward


def _vocab_parallel_ce(logits: torch.Tensor, labels: torch.Tensor, local_vocab: int, tp: int) -> torch.Tensor:
    """Mean cross entropy over a vocabulary split across ranks (max and sums all-reduced)."""
    if tp == 1:
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    top = logits.max(dim=-1).values.detach()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    shifted = logits - top[..., None]
    start = dist.get_rank() * local_vocab
    local = labels - start
    mine = (local >= 0) & (local < local_vocab)
    picked = shifted.gather(-1, local.clamp(0, local_vocab - 1)[..., None]).squeeze(-1) * mine
    total = _all_reduce(shifted.exp().sum(-1), tp)
    return (total.log() - _all_reduce(picked, tp)).mean()
