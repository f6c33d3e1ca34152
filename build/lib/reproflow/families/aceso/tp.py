"""What every op is made of: its tensors' layouts, its weights, its tensor-parallel (TP) group.

An op (`OpDef`) is defined once and used twice: the profiler runs it alone with random inputs on
the job's ranks, the runtime chains it with the other ops of a pipeline stage. Each tensor an op
takes or makes is an `Act`: the logical shape for the whole micro-batch, the dimension split over
the data-parallel (DP) ranks and the one split over the TP ranks (None: every TP rank holds all of
it). Weights are `Weight`s: the full shape and the dimension split over the TP ranks; the runtime
initialises the full tensor from a seed and keeps its own slice, so any partition of a model starts
from the same numbers as a single process.

Gradient convention, which the runtime's resharding relies on: a tensor replicated over TP ranks
carries the full gradient on every replica; a split tensor carries the gradient of its own slice.
`copy` and `reduce` are Megatron's regions; `gather` and `split` move between split and replicated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Group:
    """A TP (or other) group seen from one of its ranks; `pg` None when it is this rank alone."""

    size: int = 1
    rank: int = 0
    pg: dist.ProcessGroup | None = None


@dataclass(frozen=True)
class Act:
    """One tensor: logical `shape` for the micro-batch, `batch` dim (None: not batched, a loss),
    `split` dim over the TP ranks (None: replicated); `high` > 0 marks integer data in [0, high)."""

    shape: tuple[int, ...]
    batch: int | None = 1
    split: int | None = None
    high: int = 0

    def local(self, tp: int, dp: int) -> tuple[int, ...]:
        """This rank's shape with `dp` batch slices and `tp` split slices."""
        shape = list(self.shape)
        if self.batch is not None:
            shape[self.batch] //= dp
        if self.split is not None:
            shape[self.split] //= tp
        return tuple(shape)

    def random(self, tp: int, dp: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Random local values: token ids or labels below `high`, else activations that take gradients."""
        if self.high:
            return torch.randint(0, self.high, self.local(tp, dp), device=device)
        return torch.randn(self.local(tp, dp), device=device, dtype=dtype, requires_grad=True)


@dataclass(frozen=True)
class Weight:
    """A weight's full shape, the dimension split over TP ranks, and its initial values."""

    shape: tuple[int, ...]
    split: int | None = None
    init: str = "normal"  # normal (std 0.02), ones, zeros

    def local(self, tp: int) -> tuple[int, ...]:
        shape = list(self.shape)
        if self.split is not None:
            shape[self.split] //= tp
        return tuple(shape)

    def full(self, seed: int) -> torch.Tensor:
        """The whole tensor drawn from `seed`, on the CPU in float32."""
        if self.init == "normal":
            return torch.randn(self.shape, generator=torch.Generator().manual_seed(seed)) * 0.02
        return torch.ones(self.shape) if self.init == "ones" else torch.zeros(self.shape)

    def make(self, tp: Group, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Parameter:
        """This rank's slice of the full tensor drawn from `seed` (the same for every partition)."""
        full = self.full(seed)
        if self.split is not None:
            full = full.chunk(tp.size, dim=self.split)[tp.rank]
        return torch.nn.Parameter(full.to(device=device, dtype=dtype).contiguous())

    def random_local(self, tp: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Parameter:
        """A slice with random values drawn where it lives (the profiler: values do not matter)."""
        return torch.nn.Parameter(torch.randn(self.local(tp), device=device, dtype=dtype) * 0.02)


@dataclass
class Env:
    """What an op sees besides its tensors and weights: its TP group, this micro-batch's slice of
    the data (`data(name)`), and the dropout probability with a key that fixes every mask."""

    tp: Group
    data: Callable[[str], torch.Tensor]
    dropout_p: float = 0.1
    key: tuple[int, ...] = ()

    def dropout(self, x: torch.Tensor, split: bool = False) -> torch.Tensor:
        """Dropout whose mask depends on the key (and the TP rank for split tensors), so TP replicas
        draw the same mask and a recomputed forward redraws it."""
        if self.dropout_p == 0.0:
            return x
        key = (*self.key, self.tp.rank if split else -1, *x.shape)
        seed = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") >> 1
        gen = torch.Generator(device=x.device).manual_seed(seed)
        keep = torch.rand(x.shape, generator=gen, device=x.device) >= self.dropout_p
        return x * keep.to(x.dtype) / (1.0 - self.dropout_p)


@dataclass
class OpDef:
    """One op: what it takes and makes, its weights, and forward(env, weights, *inputs) -> outputs.
    `data` names the dataset tensors it reads (token ids, labels, images) with their layouts."""

    name: str
    ins: tuple[Act, ...]
    outs: tuple[Act, ...]
    weights: dict[str, Weight]
    forward: Callable[..., tuple[torch.Tensor, ...]]
    data: dict[str, Act] = field(default_factory=dict)


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, g: Group) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=g.pg)
        return out

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, g: Group) -> torch.Tensor:
        ctx.g = g  # type: ignore[attr-defined]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.g.pg)  # type: ignore[attr-defined]
        return grad, None


def _all_gather(x: torch.Tensor, g: Group, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(g.size)]
    dist.all_gather(parts, x.contiguous(), group=g.pg)
    return torch.cat(parts, dim=dim)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, g: Group, dim: int) -> torch.Tensor:
        ctx.g, ctx.dim = g, dim  # type: ignore[attr-defined]
        return _all_gather(x, g, dim)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        g, dim = ctx.g, ctx.dim  # type: ignore[attr-defined]
        return grad.chunk(g.size, dim=dim)[g.rank].contiguous(), None, None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, g: Group, dim: int) -> torch.Tensor:
        ctx.g, ctx.dim = g, dim  # type: ignore[attr-defined]
        return x.chunk(g.size, dim=dim)[g.rank].contiguous()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_gather(grad, ctx.g, ctx.dim), None, None  # type: ignore[attr-defined]


def reduce(x: torch.Tensor, g: Group) -> torch.Tensor:
    """Sum over the group; the gradient passes through (a row-parallel output)."""
    return x if g.size == 1 else _Reduce.apply(x, g)


def copy(x: torch.Tensor, g: Group) -> torch.Tensor:
    """Identity; the gradient is summed over the group (a column-parallel input)."""
    return x if g.size == 1 else _Copy.apply(x, g)


def gather(x: torch.Tensor, g: Group, dim: int) -> torch.Tensor:
    """All-gather slices along `dim` into the replicated tensor; each keeps its slice's gradient."""
    return x if g.size == 1 else _Gather.apply(x, g, dim)


def split(x: torch.Tensor, g: Group, dim: int) -> torch.Tensor:
    """This rank's slice along `dim` of a replicated tensor; the full gradient is all-gathered back."""
    return x if g.size == 1 else _Split.apply(x, g, dim)


def weight_seed(seed: int, op_index: int, name: str) -> int:
    """The seed of one weight of one op: the same whatever the partition."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{op_index}/{name}".encode(), digest_size=8).digest(),
                          "little") >> 1

