"""Image tiles across ranks and the halo exchange between neighbouring tiles.

A `Patch` is a tensor plus the global rows and columns it covers at its resolution. A rank owns one
tile of every resolution (its image tile divided by the strides so far). Before a convolution or a
pooling, `Space.exchange` extends the owned tile by the rows and columns the window reads beyond
it: non-blocking sends and receives with the up to 8 neighbours of the 3×3 stencil (corners only
for square slicing), and the layer's padding value outside the image. The exchange is an autograd
function whose backward sends the halo's gradient back to its owner, so training is exact.

With halo-D2 a group of layers exchanges once, as wide as the whole group reads, and its layers
run "valid" on the extended patch; positions outside the image are reset to each layer's padding
value before it reads them, so borders match the zero-padded serial model too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from reproflow.families.spatial.comm import Comm


@dataclass(frozen=True)
class Span:
    """Half-open range [lo, hi) of global indices on one axis."""

    lo: int
    hi: int

    @property
    def size(self) -> int:
        """Number of indices."""
        return self.hi - self.lo

    def union(self, other: Span | None) -> Span:
        """The smallest span covering both."""
        return self if other is None else Span(min(self.lo, other.lo), max(self.hi, other.hi))

    def meet(self, other: Span) -> Span:
        """The overlap of both."""
        return Span(max(self.lo, other.lo), min(self.hi, other.hi))

    def within(self, other: Span) -> bool:
        """True when every index of self lies in other."""
        return other.lo <= self.lo and self.hi <= other.hi


@dataclass(frozen=True)
class Window:
    """One axis of a convolution or pooling: output o reads inputs o·stride − pad + [0, size).

    Layers are 'same'-shaped: an input extent n gives n / stride outputs (pad may be −1 for the
    one-pixel shift of AmoebaNet's factorized reduction).
    """

    size: int = 1
    stride: int = 1
    pad: int = 0

    def needs(self, out: Span) -> Span:
        """Input indices the outputs `out` read."""
        return Span(out.lo * self.stride - self.pad, (out.hi - 1) * self.stride - self.pad + self.size)

    def gives(self, inp: Span) -> Span:
        """Outputs computable from the inputs `inp` alone (a 'valid' window)."""
        lo = -(-(inp.lo + self.pad) // self.stride)
        return Span(lo, (inp.hi + self.pad - self.size) // self.stride + 1)


# Direction (dr, dc) of a neighbour -> message tag; backward messages add 16.
_DIRECTIONS = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]


def _tag(d: tuple[int, int], backward: bool) -> int:
    return (d[0] + 1) * 3 + (d[1] + 1) + (16 if backward else 0)


@dataclass(frozen=True)
class Grid:
    """The tiles of one spatial stage: `rows` × `cols` ranks in row-major order, and this rank's place."""

    rows: int
    cols: int
    row: int
    col: int
    ranks: tuple[int, ...]

    @property
    def parts(self) -> int:
        """Tiles in the grid."""
        return self.rows * self.cols

    def neighbour(self, d: tuple[int, int]) -> int | None:
        """The rank of the tile in direction d, None beyond the image."""
        r, c = self.row + d[0], self.col + d[1]
        if 0 <= r < self.rows and 0 <= c < self.cols:
            return self.ranks[r * self.cols + c]
        return None

    def own(self, extent: tuple[int, int]) -> tuple[Span, Span]:
        """This rank's tile of an image of `extent` (H, W)."""
        if extent[0] % self.rows or extent[1] % self.cols or extent[0] < self.rows or extent[1] < self.cols:
            raise ValueError(f"a {extent[0]}x{extent[1]} activation does not split into {self.rows}x{self.cols} "
                             "equal tiles; use a larger --image-size, fewer --num-spatial-parts, or fewer layers in "
                             "the spatial partitions (--balance)")
        h, w = extent[0] // self.rows, extent[1] // self.cols
        return Span(self.row * h, (self.row + 1) * h), Span(self.col * w, (self.col + 1) * w)


SERIAL = Grid(1, 1, 0, 0, (0,))


class Space:
    """Where a partition's patches live: its grid, the communicator and the spatial group.

    One tile (`SERIAL`) is the unsplit model: exchanges only pad. `d2` makes `Fused` groups
    exchange once per group; `exchanges` counts the exchanges that sent messages. Without `comm`
    the exchanges only pad and check their widths (a dry run on the meta device).
    """

    def __init__(self, grid: Grid = SERIAL, comm: Comm | None = None, group: Any = None, d2: bool = False) -> None:
        self.grid = grid
        self.comm = comm
        self.group = group
        self.d2 = d2
        self.valid = False
        self.exchanges = 0

    @property
    def split(self) -> bool:
        """True when the image is split over several ranks."""
        return self.grid.parts > 1

    def own(self, extent: tuple[int, int]) -> tuple[Span, Span]:
        """This rank's tile at a resolution."""
        return self.grid.own(extent)

    @contextlib.contextmanager
    def fused(self) -> Iterator[None]:
        """Inside a halo-D2 group: layers compute on what they have, no exchanges."""
        self.valid = True
        try:
            yield
        finally:
            self.valid = False

    def exchange(self, x: Patch, rows: Span, cols: Span, fill: float) -> Patch:
        """`x` (this rank's tile) extended or cropped to `rows` × `cols`; neighbours' data inside the
        image, `fill` outside it."""
        own_r, own_c = self.own(x.extent)
        if x.rows != own_r or x.cols != own_c:
            x = x.crop(own_r, own_c)
        x = x.crop(rows.meet(own_r), cols.meet(own_c))
        halo = (max(0, x.rows.lo - rows.lo), max(0, rows.hi - x.rows.hi),
                max(0, x.cols.lo - cols.lo), max(0, cols.hi - x.cols.hi))
        if not any(halo):
            return x
        top, bottom, left, right = halo
        if self.split and (max(top, bottom) > own_r.size or max(left, right) > own_c.size):
            raise ValueError(
                f"a halo of {max(halo)} px is wider than the {own_r.size}x{own_c.size} tile; use a larger "
                "--image-size, fewer --num-spatial-parts, or fewer --fused-layers")
        if self.split and self.comm is not None:
            self.exchanges += 1
        data = _Halo.apply(x.data, self, halo, fill)
        return Patch(data, rows, cols, x.extent, self)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Differentiable sum of `t` over the spatial group (identity for one tile)."""
        if not self.split or self.comm is None:
            return t
        return _AllReduce.apply(t, self)

    def _blocks(self, halo: tuple[int, int, int, int], h: int, w: int) -> tuple[list, list]:
        """Receives (direction, neighbour, rows, cols of the extended patch) and sends (direction,
        neighbour, rows, cols of my tile) of one exchange."""
        top, bottom, left, right = halo
        width = {(-1, 0): top, (1, 0): bottom, (-1, 1): left, (1, 1): right}
        out = ({-1: slice(0, top), 0: slice(top, top + h), 1: slice(top + h, top + h + bottom)},
               {-1: slice(0, left), 0: slice(left, left + w), 1: slice(left + w, left + w + right)})
        # The neighbour in direction d reads its halo on side -d from my edge on side d.
        mine = ({-1: slice(0, bottom), 0: slice(0, h), 1: slice(h - top, h)},
                {-1: slice(0, right), 0: slice(0, w), 1: slice(w - left, w)})

        def wide(d: tuple[int, int]) -> bool:
            return all(width[(d[a], a)] > 0 for a in (0, 1) if d[a])

        recvs, sends = [], []
        for d in _DIRECTIONS:
            nb = self.grid.neighbour(d)
            if nb is None:
                continue
            if wide(d):
                recvs.append((d, nb, out[0][d[0]], out[1][d[1]]))
            if wide((-d[0], -d[1])):
                sends.append((d, nb, mine[0][d[0]], mine[1][d[1]]))
        return recvs, sends


class _Halo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, data: torch.Tensor, space: Space, halo: tuple[int, int, int, int],  # type: ignore[override]
                fill: float) -> torch.Tensor:
        top, bottom, left, right = halo
        h, w = data.shape[-2:]
        out = data.new_full((*data.shape[:-2], top + h + bottom, left + w + right), fill)
        out[..., top:top + h, left:left + w] = data
        if space.split and space.comm is not None:
            recvs, sends = space._blocks(halo, h, w)
            comm = space.comm
            bufs = [(torch.empty_like(out[..., r, c], memory_format=torch.contiguous_format), r, c)
                    for _, _, r, c in recvs]
            reqs = [comm.irecv(buf, nb, _tag(d, False)) for (d, nb, _, _), (buf, _, _) in zip(recvs, bufs, strict=True)]
            reqs += [comm.isend(data[..., r, c].contiguous(), nb, _tag((-d[0], -d[1]), False)) for d, nb, r, c in sends]
            comm.wait(reqs)
            for buf, r, c in bufs:
                out[..., r, c] = buf
        ctx.space, ctx.halo, ctx.hw = space, halo, (h, w)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        space, halo, (h, w) = ctx.space, ctx.halo, ctx.hw
        top, left = halo[0], halo[2]
        g = grad[..., top:top + h, left:left + w].contiguous()
        if space.split:
            # The transpose of the forward exchange: each halo's gradient goes back to its owner.
            recvs, sends = space._blocks(halo, h, w)
            comm = space.comm
            bufs = [(torch.empty_like(g[..., r, c], memory_format=torch.contiguous_format), r, c)
                    for _, _, r, c in sends]
            reqs = [comm.irecv(buf, nb, _tag((-d[0], -d[1]), True))
                    for (d, nb, _, _), (buf, _, _) in zip(sends, bufs, strict=True)]
            reqs += [comm.isend(grad[..., r, c].contiguous(), nb, _tag(d, True)) for d, nb, r, c in recvs]
            comm.wait(reqs)
            for buf, r, c in bufs:
                g[..., r, c] += buf
        return g, None, None, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, space: Space) -> torch.Tensor:  # type: ignore[override]
        ctx.space = space
        out = t.detach().clone().contiguous()
        space.comm.all_reduce(out, space.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        out = grad.clone().contiguous()
        ctx.space.comm.all_reduce(out, ctx.space.group)
        return out, None


@dataclass(frozen=True)
class Patch:
    """A tensor (N, C, h, w) covering global `rows` × `cols` of an image of `extent` (H, W)."""

    data: torch.Tensor
    rows: Span
    cols: Span
    extent: tuple[int, int]
    space: Space

    @classmethod
    def whole(cls, data: torch.Tensor, space: Space | None = None) -> Patch:
        """An unsplit image."""
        h, w = data.shape[-2:]
        return cls(data, Span(0, h), Span(0, w), (h, w), space or Space())

    def crop(self, rows: Span, cols: Span) -> Patch:
        """The part covering `rows` × `cols` (which must lie inside)."""
        if not (rows.within(self.rows) and cols.within(self.cols)):
            raise ValueError(f"cannot crop {rows}x{cols} from a patch covering {self.rows}x{self.cols}")
        r0, c0 = rows.lo - self.rows.lo, cols.lo - self.cols.lo
        return replace(self, data=self.data[..., r0:r0 + rows.size, c0:c0 + cols.size], rows=rows, cols=cols)

    def inside(self) -> torch.Tensor | None:
        """Mask (1, 1, h, w) of positions inside the image, None when all are."""
        image_r, image_c = Span(0, self.extent[0]), Span(0, self.extent[1])
        if self.rows.within(image_r) and self.cols.within(image_c):
            return None
        dev = self.data.device
        r = torch.arange(self.rows.lo, self.rows.hi, device=dev)
        c = torch.arange(self.cols.lo, self.cols.hi, device=dev)
        mask = ((r >= 0) & (r < self.extent[0]))[:, None] & ((c >= 0) & (c < self.extent[1]))[None, :]
        return mask[None, None]

    def fill_outside(self, value: float) -> Patch:
        """Positions outside the image set to `value` (the padding the next layer reads)."""
        mask = self.inside()
        if mask is None:
            return self
        return replace(self, data=self.data.masked_fill(~mask, value))
