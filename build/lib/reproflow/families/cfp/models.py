"""CFP's three models in plain torch.nn: GPT, GShard-style MoE and LLaMA2, and their sizes.

Each model's forward takes token ids and targets and returns the mean cross-entropy, so the
whole training step (forward, loss, backward) can be captured as one ATen graph. Layers sit in
`model.layers`, each two residual halves, so parameter names (`layers.3.0.fn.qkv.weight`) tell
which half layer an operator belongs to. The attention projection is laid out per head
([heads, 3 * head_dim] after the reshape, as Alpa's Flax GPT does), so a split of its output
columns is a split of the heads, and attention's matmuls keep the heads as their own dim
(`heads_matmul`), so that split stays communication-free through attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from reproflow.spec.errors import ParamError


@dataclass(frozen=True)
class ModelConfig:
    """One model size. `num_experts` and `expert_group_size` are the MoE's; `ffn` is LLaMA's SwiGLU width
    (GPT and the MoE's dense layers use 4 * hidden)."""

    seq_len: int
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    num_experts: int = 0
    expert_group_size: int = 0
    ffn: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# Alpa's GPT specs (seq_len, hidden_size, num_layers, num_heads, vocab_size) and two sizes for CPUs:
# tiny, and wide, whose weights are large against its activations (a short sequence, a wide hidden
# size), as a large model's are against one device's share of a batch: gradients (13 MB a layer)
# then cost a link more than the activations (256 KB a tensor at batch 8).
GPT_SIZES = {
    "125M": ModelConfig(1024, 768, 12, 12, 51200),
    "350M": ModelConfig(1024, 1024, 24, 16, 51200),
    "760M": ModelConfig(1024, 1536, 24, 16, 51200),
    "1.3B": ModelConfig(1024, 2048, 24, 32, 51200),
    "2.6B": ModelConfig(1024, 2560, 32, 32, 51200),
    "tiny": ModelConfig(64, 64, 2, 4, 512),
    "wide": ModelConfig(16, 512, 2, 8, 512),
}
# The seed's MoEModelConfig(seq_len, hidden_size, num_layers, num_heads, vocab_size, num_experts,
# expert_group_size); the 2-head variant is the one it runs at micro-batch 96 and 128.
MOE_SIZES = {
    "seed": ModelConfig(1024, 1280, 16, 4, 32000, 32, 2048),
    "seed-2head": ModelConfig(1024, 1280, 16, 2, 32000, 32, 2048),
    "tiny": ModelConfig(32, 64, 2, 4, 512, 4, 32),
    "wide": ModelConfig(16, 512, 2, 8, 512, 4, 32),
}
# LLaMA2-7B and a tiny size (ffn: the SwiGLU width).
LLAMA_SIZES = {
    "7B": ModelConfig(4096, 4096, 32, 32, 32000, ffn=11008),
    "tiny": ModelConfig(64, 64, 2, 4, 512, ffn=176),
    "wide": ModelConfig(16, 512, 2, 8, 512, ffn=1376),
}
SIZES = {"gpt": GPT_SIZES, "moe": MOE_SIZES, "llama": LLAMA_SIZES}


def config_of(model: str, size: str, num_layers: int = 0, seq_len: int = 0) -> ModelConfig:
    """The size's config, with `num_layers` / `seq_len` overriding the size's when non-zero."""
    sizes = SIZES[model]
    if size not in sizes:
        raise ParamError(f"size {size!r} is not a {model} size.", f"one of {', '.join(sizes)}")
    c = sizes[size]
    return replace(c, num_layers=num_layers or c.num_layers, seq_len=seq_len or c.seq_len)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Rotary position embedding on [batch, heads, seq, head_dim] (LLaMA's, half-split form)."""
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=x.device), inv)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


@torch.library.custom_op("reproflow_cfp::heads_matmul", mutates_args=())
def heads_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Attention's matmul, [batch, heads, m, k] @ [batch, heads, k, n], kept one operator in the captured
    graph. torch.matmul folds batch and heads into one dim for bmm, where a split of the heads is no
    longer a split of a dim, so the analysis saw head-split attention communicate; XLA's dot keeps both
    as batch dims. Its backward is this operator again."""
    return torch.matmul(a, b)


@heads_matmul.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(*a.shape[:-1], b.shape[-1])


def _keep(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[torch.Tensor, torch.Tensor],
          output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _heads_matmul_backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = ctx.saved_tensors  # type: ignore[attr-defined]
    return heads_matmul(g, b.transpose(-2, -1)), heads_matmul(a.transpose(-2, -1), g)


heads_matmul.register_autograd(_heads_matmul_backward, setup_context=_keep)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, bias: bool, rotary: bool) -> None:
        super().__init__()
        self.c, self.rotary = c, rotary
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size, bias=bias)
        self.proj = nn.Linear(c.hidden_size, c.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, self.c.num_heads, 3 * self.c.head_dim)
        q, k, v = (z.transpose(1, 2) for z in qkv.split(self.c.head_dim, dim=3))
        if self.rotary:
            q, k = rotate(q, t), rotate(k, t)
        att = heads_matmul(q, k.transpose(-2, -1)) * (self.c.head_dim ** -0.5)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        # -1, not h: under tensor parallelism this rank holds only its heads (families/cfp/megatron.py).
        return self.proj(heads_matmul(att, v).transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, 4 * c.hidden_size)
        self.fc2 = nn.Linear(4 * c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLU(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(c.hidden_size, c.ffn, bias=False)
        self.w3 = nn.Linear(c.hidden_size, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """GShard's top-2 mixture of experts: tokens in groups of `expert_group_size`, each expert takes at
    most 2 * group / experts tokens of a group, and dispatch and combine are einsums (contractions)."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.wi = nn.Parameter(torch.randn(c.num_experts, c.hidden_size, 4 * c.hidden_size) * 0.02)
        self.wo = nn.Parameter(torch.randn(c.num_experts, 4 * c.hidden_size, c.hidden_size) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        e, s = self.c.num_experts, min(self.c.expert_group_size, b * t)
        xg = x.reshape(b * t // s, s, h)
        gates = self.gate(xg).softmax(-1)  # [g, s, e]
        experts = torch.arange(e, device=x.device)
        capacity = max(2 * s // e, 1)
        slots = torch.arange(capacity, device=x.device)
        # dispatch[g, s, e, c] = 1: token s of group g goes to slot c of expert e
        dispatch = torch.zeros(*gates.shape, capacity, device=x.device)
        combine = torch.zeros(*gates.shape, capacity, device=x.device)
        taken = torch.zeros_like(gates)
        used = torch.zeros_like(gates[:, :1])  # slots of each expert already filled in the group
        for _ in range(2):  # the top-1 expert, then the best of the rest; tokens past capacity are dropped
            choice = (gates * (1 - taken)).argmax(-1, keepdim=True)
            mask = (choice == experts).to(x.dtype)  # [g, s, e]
            position = (mask.cumsum(1) - 1 + used) * mask
            slot = (position.unsqueeze(-1) == slots).to(x.dtype) * mask.unsqueeze(-1)
            dispatch = dispatch + slot
            combine = combine + slot * (gates * mask).unsqueeze(-1)
            taken = taken + mask
            used = used + mask.sum(1, keepdim=True)
        expert_in = torch.einsum("gsec,gsm->egcm", dispatch, xg)
        return torch.einsum("gsec,egcm->gsm", combine, self.experts(expert_in)).reshape(b, t, h)

    def experts(self, expert_in: torch.Tensor) -> torch.Tensor:
        """Every expert's feed-forward on its slots [experts, groups, capacity, hidden]."""
        hidden = F.gelu(torch.einsum("egcm,emf->egcf", expert_in, self.wi))
        return torch.einsum("egcf,efm->egcm", hidden, self.wo)


class Residual(nn.Module):
    """x + fn(norm(x)): half a layer, and a segment of the analysis (its output is one activation)."""

    def __init__(self, norm: nn.Module, fn: nn.Module) -> None:
        super().__init__()
        self.norm, self.fn = norm, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fn(self.norm(x))


def layer(c: ModelConfig, kind: str) -> nn.Sequential:
    """A pre-norm transformer layer: attention, then the MLP (GPT), SwiGLU (LLaMA) or experts (MoE)."""
    llama = kind == "llama"
    def norm() -> nn.Module:
        return RMSNorm(c.hidden_size) if llama else nn.LayerNorm(c.hidden_size)
    ffn = {"llama": SwiGLU, "moe": MoE, "gpt": MLP}[kind](c)
    return nn.Sequential(Residual(norm(), Attention(c, bias=not llama, rotary=llama)), Residual(norm(), ffn))


class Head(nn.Module):
    """The final norm, the untied output projection and the mean cross-entropy."""

    def __init__(self, model: str, c: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(c.hidden_size) if model == "llama" else nn.LayerNorm(c.hidden_size)
        self.head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.head(self.norm(x)), targets)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of the logits [batch, seq, vocab]."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class LanguageModel(nn.Module):
    """Embeddings, `num_layers` layers and an untied head; GPT adds learned positions, the MoE makes every
    second layer a mixture of experts (as GShard), LLaMA uses rotary positions in attention."""

    def __init__(self, model: str, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c.vocab_size, c.hidden_size)
        self.wpe = nn.Embedding(c.seq_len, c.hidden_size) if model != "llama" else None
        kinds = ["moe" if model == "moe" and i % 2 else ("llama" if model == "llama" else "gpt")
                 for i in range(c.num_layers)]
        self.layers = nn.ModuleList(layer(c, k) for k in kinds)
        self.out = Head(model, c)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.out(x, targets)

    def segments(self) -> dict[str, nn.Module]:
        """The modules whose parameters name the analysis's segments: each half layer and the output head."""
        return {f"layers.{i}.{j}": half for i, lay in enumerate(self.layers) for j, half in enumerate(lay)} | {
            "out": self.out}


def build(model: str, c: ModelConfig, seed: int = 0) -> LanguageModel:
    """The model with weights drawn from `seed` (the same on every rank)."""
    torch.manual_seed(seed)
    m = LanguageModel(model, c)
    for name, p in m.named_parameters():
        if p.dim() >= 2 and "wi" not in name and "wo" not in name:
            nn.init.normal_(p, std=0.02)
    return m


def batch(c: ModelConfig, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic token ids and next-token targets."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, c.vocab_size, (batch_size, c.seq_len + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
