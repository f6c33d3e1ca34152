"""T5's ops at Aceso's granularity, each runnable alone on `tp` ranks (partition algorithm 0 only,
as the reference: column-parallel qkv and GEMM-1, row-parallel dense and GEMM-2).

Encoder: embedding, 13 ops per layer (as GPT's, bidirectional attention), final layernorm.
Decoder: embedding, 21 ops per layer (self-attention `-1` with a causal mask, cross-attention `-2`
whose keys and values come from the encoder output, MLP, three layernorms), final layernorm, and
the output layer with cross entropy. Attention heads have `kv_channels` dimensions (T5-3B and up
use 128 with 1024 hidden). Decoder ops carry the encoder output for the cross-attention; ops inside
a residual block carry its residual, as in gpt_ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reproflow.families.aceso.tp import DROPOUT, BuiltOp, Maker, copy, lm_loss, reduce, vocab_embedding

ENCODER_LAYER = ("enc-1st-layernorm", "enc-attention-qkv", "enc-attention-score", "enc-attention-softmax",
                 "enc-attention-dropout", "enc-attention-context", "enc-attention-dense",
                 "enc-post-attention-dropout", "enc-2nd-layernorm", "enc-MLP-GEMM-1", "enc-MLP-gelu",
                 "enc-MLP-GEMM-2", "enc-post-MLP-dropout")
DECODER_LAYER = ("dec-1st-layernorm", "dec-attention-qkv-1", "dec-attention-score-1", "dec-attention-softmax-1",
                 "dec-attention-dropout-1", "dec-attention-context-1", "dec-attention-dense-1",
                 "dec-post-attention-dropout-1", "dec-2nd-layernorm", "dec-attention-qkv-2", "dec-attention-score-2",
                 "dec-attention-softmax-2", "dec-attention-dropout-2", "dec-attention-context-2",
                 "dec-attention-dense-2", "dec-post-attention-dropout-2", "dec-3rd-layernorm", "dec-MLP-GEMM-1",
                 "dec-MLP-gelu", "dec-MLP-GEMM-2", "dec-post-MLP-dropout")
OPS = ("encoder-embedding", *ENCODER_LAYER, "enc-final-layernorm", "decoder-embedding", *DECODER_LAYER,
       "dec-final-layernorm", "t5-post-process")
# Ops that carry the residual of their block (a layernorm starts a block, a post-dropout ends it).
_STARTS = ("enc-1st-layernorm", "enc-2nd-layernorm", "dec-1st-layernorm", "dec-2nd-layernorm", "dec-3rd-layernorm")
_ENDS = ("enc-post-attention-dropout", "enc-post-MLP-dropout", "dec-post-attention-dropout-1",
         "dec-post-attention-dropout-2", "dec-post-MLP-dropout")


@dataclass(frozen=True)
class Dims:
    enc_seq: int
    dec_seq: int
    hidden: int
    ffn: int
    heads: int
    kv: int
    vocab: int


def _in_block(op: str) -> tuple[bool, bool]:
    """(carries the residual in, carries it out)."""
    if op in _STARTS:
        return False, True
    if op in _ENDS:
        return True, False
    inside = any(k in op for k in ("attention", "MLP")) and op not in _ENDS
    return inside, inside


def build(op: str, d: Dims, mbs: int, tp: int, device: torch.device, dtype: torch.dtype) -> BuiltOp:
    """The op with its inputs for micro-batch `mbs` on `tp` ranks."""
    b, h, nh, kv = mbs, d.hidden, d.heads // tp, d.kv
    decoder = op.startswith("dec") or op == "decoder-embedding"
    s = d.dec_seq if decoder else d.enc_seq
    cross = op.endswith("-2")
    s_kv = d.enc_seq if cross else s

    make = Maker(device, dtype)
    param, act = make.param, make.act

    res_in, res_out = _in_block(op)
    carried: list[torch.Tensor] = []
    if res_in:
        carried.append(act(s, b, h))
    if decoder and op != "decoder-embedding":
        carried.append(act(d.enc_seq, b, h))  # the encoder output, for every cross-attention

    def op_with(main: Callable[..., torch.Tensor], inputs: list[torch.Tensor],
                params: list[torch.nn.Parameter]) -> BuiltOp:
        """Main computation on the first `len(inputs)` tensors; carried tensors pass on (or end)."""
        k = len(inputs)

        def forward(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            own, rest = xs[:k], list(xs[k:])
            out = [main(*own)]
            if res_in and not res_out:
                out[0] = out[0] + rest.pop(0)  # the residual add that ends a block
            elif res_out and not res_in:
                out.append(own[0])  # a block-starting layernorm: its input is the residual
            return (*out, *rest)
        return BuiltOp(forward, [*inputs, *carried], params)

    if op in ("encoder-embedding", "decoder-embedding"):
        embed, ids, params = vocab_embedding(make, d.vocab, h, s, b, tp)
        # The decoder's embedding receives the encoder output and starts carrying it.
        return BuiltOp(lambda ids_, *enc: (embed(ids_), *enc), [ids, act(d.enc_seq, b, h)] if decoder else [ids],
                       params)
    if "layernorm" in op:
        w, bias = param(h), param(h)
        return op_with(lambda x: F.layer_norm(x, (h,), w, bias), [act(s, b, h)], [w, bias])
    if "qkv" in op:
        if cross:
            wq, wkv = param(nh * kv, h), param(2 * nh * kv, h)

            def qkv2(x: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
                return torch.cat([F.linear(copy(x, tp), wq).flatten(),
                                  F.linear(copy(enc, tp), wkv).flatten()])
            x = act(s, b, h)

            def cross_forward(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                res, enc = xs[1], xs[2]
                return qkv2(xs[0], enc), res, enc
            return BuiltOp(cross_forward, [x, *carried], [wq, wkv])
        w = param(3 * nh * kv, h)
        return op_with(lambda x: F.linear(copy(x, tp), w), [act(s, b, h)], [w])
    if "score" in op:
        def score(x: torch.Tensor) -> torch.Tensor:
            if cross:
                q = x[: s * b * nh * kv].view(s, b * nh, kv)
                k = x[s * b * nh * kv:].view(s_kv, b * nh, 2 * kv)[..., :kv]
            else:
                q, k, _ = x.view(s, b * nh, 3 * kv).split(kv, dim=-1)
            return torch.bmm(q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2)) / math.sqrt(kv)
        size = s * b * nh * kv + 2 * s_kv * b * nh * kv if cross else s * b * 3 * nh * kv
        x = act(size) if cross else act(s, b, 3 * nh * kv)
        return op_with(score, [x], [])
    if "softmax" in op:
        causal = decoder and not cross
        mask = torch.ones(s, s_kv, device=device, dtype=torch.bool).triu(1) if causal else None
        return op_with(lambda x: torch.softmax(x if mask is None else x.masked_fill(mask, -10000.0), dim=-1),
                       [act(b * nh, s, s_kv)], [])
    if "post-attention-dropout" in op or "post-MLP-dropout" in op:
        return op_with(lambda x: F.dropout(x, DROPOUT), [act(s, b, h)], [])
    if "attention-dropout" in op:
        return op_with(lambda x: F.dropout(x, DROPOUT), [act(b * nh, s, s_kv)], [])
    if "context" in op:
        def context(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.bmm(p, v.transpose(0, 1)).transpose(0, 1).reshape(s, b, nh * kv)
        return op_with(context, [act(b * nh, s, s_kv), act(s_kv, b * nh, kv)], [])
    if "dense" in op:
        w, bias = param(h, nh * kv), param(h)
        return op_with(lambda x: reduce(F.linear(x, w), tp) + bias, [act(s, b, nh * kv)], [w, bias])
    if "GEMM-1" in op:
        w, bias = param(d.ffn // tp, h), param(d.ffn // tp)
        return op_with(lambda x: F.linear(copy(x, tp), w, bias), [act(s, b, h)], [w, bias])
    if "gelu" in op:
        return op_with(F.gelu, [act(s, b, d.ffn // tp)], [])
    if "GEMM-2" in op:
        w, bias = param(h, d.ffn // tp), param(h)
        return op_with(lambda x: reduce(F.linear(x, w), tp) + bias, [act(s, b, d.ffn // tp)], [w, bias])
    if op == "t5-post-process":
        loss, params = lm_loss(make, d.vocab, h, s, b, tp)
        return BuiltOp(lambda x: (loss(x),), [act(s, b, h)], params)
    raise ValueError(f"unknown T5 op {op!r}")
