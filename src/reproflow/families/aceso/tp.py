"""Tensor-parallel building blocks shared by the GPT, T5 and Wide-ResNet ops (Megatron's regions).

`reduce` sums over the TP ranks (identity backward), `copy` is the identity whose gradient is
summed, `gather_channels` all-gathers output channels; `vocab_embedding` and `lm_loss` are the
vocabulary-parallel embedding and output layer with cross entropy. The TP group is the job's world.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

DROPOUT = 0.1


@dataclass
class BuiltOp:
    """One op ready to time: forward(*inputs) -> outputs; `inputs` that need gradients first."""

    forward: Callable[..., tuple[torch.Tensor, ...]]
    inputs: list[torch.Tensor]
    params: list[torch.nn.Parameter]


@dataclass(frozen=True)
class Maker:
    """Random weights and activations on one device and dtype."""

    device: torch.device
    dtype: torch.dtype

    def param(self, *shape: int) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.randn(*shape, device=self.device, dtype=self.dtype) * 0.02)

    def act(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.dtype, requires_grad=True)


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
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()


def reduce(x: torch.Tensor, tp: int) -> torch.Tensor:
    """Sum over the TP ranks; the gradient passes through (a row-parallel output)."""
    return x if tp == 1 else _Reduce.apply(x)


def copy(x: torch.Tensor, tp: int) -> torch.Tensor:
    """Identity; the gradient is summed over the TP ranks (a column-parallel input)."""
    return x if tp == 1 else _Copy.apply(x)


def gather_channels(x: torch.Tensor, tp: int) -> torch.Tensor:
    """All-gather dim 1 (channels) over the TP ranks; each keeps its own channels' gradient."""
    return x if tp == 1 else _Gather.apply(x)


def vocab_embedding(make: Maker, vocab: int, hidden: int, seq: int, batch: int,
                    tp: int) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor, list[torch.nn.Parameter]]:
    """(forward on token ids, the ids, weights): word rows split over the ranks, plus positions."""
    local_vocab = vocab // tp
    words, pos = make.param(local_vocab, hidden), make.param(seq, hidden)
    ids = torch.randint(0, vocab, (seq, batch), device=make.device)
    start = dist.get_rank() * local_vocab if tp > 1 else 0

    def forward(ids_: torch.Tensor) -> torch.Tensor:
        local = ids_ - start
        outside = (local < 0) | (local >= local_vocab)
        e = F.embedding(local.masked_fill(outside, 0), words).masked_fill(outside[..., None], 0.0)
        return F.dropout(reduce(e, tp) + pos[:, None, :], DROPOUT)
    return forward, ids, [words, pos]


def lm_loss(make: Maker, vocab: int, hidden: int, seq: int, batch: int,
            tp: int) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[torch.nn.Parameter]]:
    """(forward on the last hidden states, weights): logits over a vocabulary split across the
    ranks and the mean cross entropy (max and sums all-reduced)."""
    local_vocab = vocab // tp
    words = make.param(local_vocab, hidden)
    labels = torch.randint(0, vocab, (seq, batch), device=make.device)

    def forward(x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(copy(x, tp), words).float()
        if tp == 1:
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        top = logits.max(dim=-1).values.detach()
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        shifted = logits - top[..., None]
        local = labels - dist.get_rank() * local_vocab
        mine = (local >= 0) & (local < local_vocab)
        picked = shifted.gather(-1, local.clamp(0, local_vocab - 1)[..., None]).squeeze(-1) * mine
        return (reduce(shifted.exp().sum(-1), tp).log() - reduce(picked, tp)).mean()
    return forward, [words]
