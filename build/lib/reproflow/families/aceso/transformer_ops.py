"""GPT's and T5's ops at Aceso's granularity, tensor-parallel as Megatron-LM.

Tensors are [sequence, batch, hidden]; attention scores [batch, heads, query, key]. Besides its
main input an op takes the tensors it carries for later ops (`CARRIED`): the residual from the
layernorm that opens a block to the add that closes it, the attention values from the score op to
the context op, the encoder output through T5's decoder, and the cross-attention keys and values.
Carried tensors count in the input and output sizes, as in Aceso's database.

Partition algorithms: qkv and GEMM-1 are column-parallel with algo 0 (weight rows split, output
split over the TP ranks) and row-parallel with algo 1 (input split, output all-reduced); dense and
GEMM-2 the other way round. qkv outputs are ordered head by head, so a column slice holds whole
heads. The embedding and the output layer split the vocabulary. T5 has algo 0 only, as the
reference; its decoder has self-attention (`-1`, causal) and cross-attention (`-2`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reproflow.families.aceso.models import GPT, GPT_LAYER, T5
from reproflow.families.aceso.tp import Act, Env, Group, OpDef, Weight, copy, reduce

GPT_OPS = ("encoder-embedding", *GPT_LAYER, "final-layernorm", "gpt-post-process")
ENCODER_LAYER = GPT_LAYER
DECODER_LAYER = ("dec-1st-layernorm", "dec-attention-qkv-1", "dec-attention-score-1", "dec-attention-softmax-1",
                 "dec-attention-dropout-1", "dec-attention-context-1", "dec-attention-dense-1",
                 "dec-post-attention-dropout-1", "dec-2nd-layernorm", "dec-attention-qkv-2", "dec-attention-score-2",
                 "dec-attention-softmax-2", "dec-attention-dropout-2", "dec-attention-context-2",
                 "dec-attention-dense-2", "dec-post-attention-dropout-2", "dec-3rd-layernorm", "dec-MLP-GEMM-1",
                 "dec-MLP-gelu", "dec-MLP-GEMM-2", "dec-post-MLP-dropout")
T5_OPS = ("encoder-embedding", *ENCODER_LAYER, "enc-final-layernorm", "decoder-embedding", *DECODER_LAYER,
          "dec-final-layernorm", "t5-post-process")
CARRIED = ("kv", "values", "res", "enc")
_STARTS = ("enc-1st-layernorm", "enc-2nd-layernorm", "dec-1st-layernorm", "dec-2nd-layernorm", "dec-3rd-layernorm")
_ENDS = ("enc-post-attention-dropout", "enc-post-MLP-dropout", "dec-post-attention-dropout-1",
         "dec-post-attention-dropout-2", "dec-post-MLP-dropout")


@dataclass(frozen=True)
class Dims:
    seq: int  # GPT's sequence, T5's encoder sequence
    hidden: int
    ffn: int
    heads: int
    kv: int  # channels per head
    vocab: int
    dec_seq: int = 0  # T5's decoder sequence; 0 for GPT

    @property
    def t5(self) -> bool:
        return self.dec_seq > 0


def dims(name: str, size: str, seq_len: int = 0) -> Dims:
    """The shapes of GPT (or scale-layer) or T5 at `size`; `seq_len` overrides the (encoder) sequence."""
    if name == "t5":
        _, enc, dec, hidden, ffn, heads, kv, vocab = T5[size]
        return Dims(seq_len or enc, hidden, ffn, heads, kv, vocab, dec)
    _, seq, hidden, ffn, heads, _, vocab = GPT["scale-layer" if name == "scale-layer" else size]
    return Dims(seq_len or seq, hidden, ffn, heads, hidden // heads, vocab)


def _carried(op: str, t5: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(carried in, carried out), in `CARRIED` order."""
    ins: set[str] = set()
    outs: set[str] = set()
    if op in _STARTS:
        outs.add("res")
    elif op in _ENDS:
        ins.add("res")
    elif "attention" in op or "MLP" in op:
        ins.add("res")
        outs.add("res")
    if "score" in op:
        outs.add("values")
    if "softmax" in op or ("attention-dropout" in op and "post" not in op):
        ins.add("values")
        outs.add("values")
    if "context" in op:
        ins.add("values")
    if "qkv-2" in op:
        outs.add("kv")
    if "score-2" in op:
        ins.add("kv")
    if t5 and op.startswith("dec-"):
        ins.add("enc")
        if op != "dec-final-layernorm":
            outs.add("enc")
    if op == "decoder-embedding":
        outs.add("enc")
    return tuple(k for k in CARRIED if k in ins), tuple(k for k in CARRIED if k in outs)


Core = Callable[[Env, dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor]],
                tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _vocab_lookup(env: Env, words: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Embedding rows of this rank's vocabulary slice, summed over the TP ranks."""
    local_vocab = words.shape[0]
    local = ids - env.tp.rank * local_vocab
    outside = (local < 0) | (local >= local_vocab)
    e = F.embedding(local.masked_fill(outside, 0), words).masked_fill(outside[..., None], 0.0)
    return reduce(e, env.tp)


def _vocab_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, tp: Group) -> torch.Tensor:
    """Mean cross entropy over logits split by vocabulary slices (max and sums all-reduced)."""
    if tp.size == 1:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    local_vocab = logits.shape[-1]
    top = logits.max(dim=-1).values.detach()
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=tp.pg)
    shifted = logits - top[..., None]
    local = labels - tp.rank * local_vocab
    mine = (local >= 0) & (local < local_vocab)
    picked = shifted.gather(-1, local.clamp(0, local_vocab - 1)[..., None]).squeeze(-1) * mine
    return (reduce(shifted.exp().sum(-1), tp).log() - reduce(picked, tp)).mean()


def build(op: str, d: Dims, mbs: int, algo: int) -> OpDef:
    """The op `op` for micro-batch `mbs` with partition algorithm `algo`."""
    decoder = op.startswith("dec") or op == "t5-post-process"
    cross = "attention" in op and op.endswith("-2")
    s, b, h, A = d.dec_seq if decoder else d.seq, mbs, d.hidden, d.heads * d.kv
    s_kv = d.seq if cross else s
    causal = not d.t5 or (decoder and not cross)
    rep = Act((s, b, h))

    def col(n: int) -> Act:
        return Act((s, b, n), 1, 2)

    scores = Act((b, d.heads, s, s_kv), 0, 1)
    specs = {"res": rep, "enc": Act((d.seq, b, h)), "values": Act((s_kv, b, d.heads, d.kv), 1, 2),
             "kv": Act((d.seq, b, 2 * A), 1, 2)}
    c_in, c_out = _carried(op, d.t5)

    def make(main_in: Act | None, main_out: Act, weights: dict[str, Weight], core: Core,
             data: dict[str, Act] | None = None) -> OpDef:
        ins = ((main_in,) if main_in is not None else ()) + tuple(specs[k] for k in c_in)
        outs = (main_out, *(specs[k] for k in c_out))

        def forward(env: Env, w: dict[str, torch.Tensor], *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            x, rest = (xs[0], xs[1:]) if main_in is not None else (torch.empty(0), xs)
            carried = dict(zip(c_in, rest, strict=True))
            y, new = core(env, w, x, carried)
            carried.update(new)
            return (y, *(carried[k] for k in c_out))
        return OpDef(op, ins, outs, weights, forward, data or {})

    def linear(n_in: int, n_out: int, column: bool) -> OpDef:
        if column:  # weight rows split: full input, split output
            return make(Act((s, b, n_in)), col(n_out),
                        {"weight": Weight((n_out, n_in), 0), "bias": Weight((n_out,), 0, "zeros")},
                        lambda env, w, x, c: (F.linear(copy(x, env.tp), w["weight"], w["bias"]), {}))
        return make(col(n_in), Act((s, b, n_out)),  # columns split: split input, all-reduced output
                    {"weight": Weight((n_out, n_in), 1), "bias": Weight((n_out,), None, "zeros")},
                    lambda env, w, x, c: (reduce(F.linear(x, w["weight"]), env.tp) + w["bias"], {}))

    if op.endswith("embedding"):
        ids = "dec_ids" if decoder else "ids"

        def embed(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor,
                  c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            e = _vocab_lookup(env, w["words"], env.data(ids)) + w["pos"][:, None, :]
            return env.dropout(e), ({"enc": x} if decoder else {})
        return make(specs["enc"] if decoder else None, rep,
                    {"words": Weight((d.vocab, h), 0), "pos": Weight((s, h))}, embed,
                    {ids: Act((s, b), 1, None, d.vocab)})
    if "layernorm" in op:
        starts = op in _STARTS

        def norm(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor,
                 c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return F.layer_norm(x, (h,), w["weight"], w["bias"]), ({"res": x} if starts else {})
        return make(rep, rep, {"weight": Weight((h,), None, "ones"), "bias": Weight((h,), None, "zeros")}, norm)
    if "qkv" in op and cross:  # queries from the decoder, keys and values from the encoder output
        def qkv2(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor,
                 c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            q = F.linear(copy(x, env.tp), w["q"], w["q_bias"])
            return q, {"kv": F.linear(copy(c["enc"], env.tp), w["kv"], w["kv_bias"])}
        return make(rep, col(A), {"q": Weight((A, h), 0), "q_bias": Weight((A,), 0, "zeros"),
                                  "kv": Weight((2 * A, h), 0), "kv_bias": Weight((2 * A,), 0, "zeros")}, qkv2)
    if "qkv" in op or "GEMM-1" in op:
        return linear(h, 3 * A if "qkv" in op else d.ffn, column=algo == 0)
    if "dense" in op or "GEMM-2" in op:
        return linear(A if "dense" in op else d.ffn, h, column=algo == 1)
    if "score" in op:
        def score(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor,
                  c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            nh, bl = d.heads // env.tp.size, x.shape[1]
            if cross:
                q = x.view(s, bl, nh, d.kv)
                k, v = c["kv"].view(s_kv, bl, nh, 2, d.kv).unbind(3)
            else:
                q, k, v = x.view(s, bl, nh, 3, d.kv).unbind(3)
            att = torch.matmul(q.permute(1, 2, 0, 3), k.permute(1, 2, 3, 0)) * d.kv**-0.5
            return att, {"values": v}
        return make(col(A) if cross else col(3 * A), scores, {}, score)
    if "softmax" in op:
        def softmax(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor,
                    c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            if causal:
                x = x.masked_fill(torch.ones(s, s_kv, device=x.device, dtype=torch.bool).triu(1), -10000.0)
            return torch.softmax(x, dim=-1), {}
        return make(scores, scores, {}, softmax)
    if "post-attention-dropout" in op or "post-MLP-dropout" in op:
        return make(rep, rep, {}, lambda env, w, x, c: (env.dropout(x) + c["res"], {}))
    if "attention-dropout" in op:
        return make(scores, scores, {}, lambda env, w, x, c: (env.dropout(x, split=True), {}))
    if "context" in op:
        def context(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor,
                    c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            out = torch.matmul(x, c["values"].permute(1, 2, 0, 3))  # [b, heads, s, kv]
            return out.permute(2, 0, 1, 3).reshape(s, x.shape[0], -1), {}
        return make(scores, col(A), {}, context)
    if "gelu" in op:
        return make(col(d.ffn), col(d.ffn), {}, lambda env, w, x, c: (F.gelu(x), {}))
    if op.endswith("post-process"):
        def loss(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor,
                 c: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            logits = F.linear(copy(x, env.tp), w["words"]).float()
            return _vocab_cross_entropy(logits, env.data("labels"), env.tp), {}
        return make(rep, Act((), None), {"words": Weight((d.vocab, h), 0)}, loss,
                    {"labels": Act((s, b), 1, None, d.vocab)})
    raise ValueError(f"unknown {'T5' if d.t5 else 'GPT'} op {op!r}")
