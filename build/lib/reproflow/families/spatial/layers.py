"""Layers on patches: the same modules run the unsplit model and every tile of a spatial stage.

Each layer that reads a window (convolution, pooling) first gets its input to cover what its
owned outputs read: a halo exchange (`Space.exchange`), or, inside a halo-D2 group, only the
image border reset to its padding value. Batch norm takes its statistics over the owned tiles of
the whole spatial group, so a split model trains exactly like the unsplit one.

`need(rows, cols, extent)` maps output spans to the input spans a layer reads (at least its own
tile), which sizes the one wide exchange of a halo-D2 group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from reproflow.families.spatial.halo import Patch, Space, Span, Window

Spans = tuple[Span, Span]


def _own_union(space: Space, spans: Spans, extent: tuple[int, int]) -> Spans:
    own_r, own_c = space.own(extent)
    return spans[0].union(own_r), spans[1].union(own_c)


class Layer(nn.Module):
    """A module from patch to patch with its total stride and its read map."""

    stride: tuple[int, int] = (1, 1)

    def need(self, space: Space, spans: Spans, extent: tuple[int, int]) -> Spans:
        """Input spans the output spans `spans` (of an output image `extent`) read, with at least the
        own tile (batch norm takes its statistics there); pointwise by default."""
        return _own_union(space, spans, extent)


class Windowed(Layer):
    """Base of convolution and pooling: windows per axis, exchange or border fill, then a valid op."""

    fill = 0.0

    def __init__(self, size: tuple[int, int], stride: tuple[int, int], pad: tuple[int, int]) -> None:
        super().__init__()
        self.windows = (Window(size[0], stride[0], pad[0]), Window(size[1], stride[1], pad[1]))
        self.stride = stride

    def need(self, space: Space, spans: Spans, extent: tuple[int, int]) -> Spans:
        inner = (extent[0] * self.stride[0], extent[1] * self.stride[1])
        return _own_union(space, (self.windows[0].needs(spans[0]), self.windows[1].needs(spans[1])), inner)

    def prepare(self, x: Patch) -> Patch:
        """The input this layer reads: own outputs' windows fetched, or (halo-D2) the border filled."""
        if x.space.valid:
            # A strided op reads from the patch's first row: start it where an output's window starts.
            wr, wc = self.windows
            r0, c0 = (-(x.rows.lo + wr.pad)) % wr.stride, (-(x.cols.lo + wc.pad)) % wc.stride
            if r0 or c0:
                x = x.crop(Span(x.rows.lo + r0, x.rows.hi), Span(x.cols.lo + c0, x.cols.hi))
            return x.fill_outside(self.fill)
        out_r, out_c = x.space.own((x.extent[0] // self.stride[0], x.extent[1] // self.stride[1]))
        return x.space.exchange(x, self.windows[0].needs(out_r), self.windows[1].needs(out_c), self.fill)

    def output(self, x: Patch, data: torch.Tensor) -> Patch:
        """The patch of a valid op's result on `x`."""
        rows, cols = self.windows[0].gives(x.rows), self.windows[1].gives(x.cols)
        extent = (x.extent[0] // self.stride[0], x.extent[1] // self.stride[1])
        return Patch(data, rows, cols, extent, x.space)


class Conv(Windowed):
    """nn.Conv2d with 'same' zero padding, computed on halo-extended tiles."""

    def __init__(self, cin: int, cout: int, size: int | tuple[int, int] = 1, stride: int | tuple[int, int] = 1,
                 pad: int | tuple[int, int] | None = None, bias: bool = False) -> None:
        size = (size, size) if isinstance(size, int) else size
        stride = (stride, stride) if isinstance(stride, int) else stride
        pad = tuple((k - 1) // 2 for k in size) if pad is None else ((pad, pad) if isinstance(pad, int) else pad)
        super().__init__(size, stride, pad)  # type: ignore[arg-type]
        self.conv = nn.Conv2d(cin, cout, size, stride, padding=0, bias=bias)

    def forward(self, x: Patch) -> Patch:
        x = self.prepare(x)
        return self.output(x, self.conv(x.data))


class MaxPool(Windowed):
    """nn.MaxPool2d with padding (the padding never wins the max)."""

    fill = float("-inf")

    def __init__(self, size: int, stride: int, pad: int) -> None:
        super().__init__((size, size), (stride, stride), (pad, pad))
        self.size = size

    def forward(self, x: Patch) -> Patch:
        x = self.prepare(x)
        return self.output(x, F.max_pool2d(x.data, self.size, self.stride))


class AvgPool(Windowed):
    """nn.AvgPool2d(count_include_pad=False): window sums over the count of in-image positions."""

    def __init__(self, size: int, stride: int, pad: int) -> None:
        super().__init__((size, size), (stride, stride), (pad, pad))
        self.size = size

    def forward(self, x: Patch) -> Patch:
        x = self.prepare(x)
        total = F.avg_pool2d(x.data, self.size, self.stride)
        mask = x.inside()
        if mask is not None:
            count = F.avg_pool2d(mask.to(x.data.dtype), self.size, self.stride)
            total = total / count
        return self.output(x, total)


class Norm(Layer):
    """BatchNorm2d whose batch statistics cover the owned tiles of the whole spatial group."""

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, eps=eps, momentum=momentum)

    def forward(self, x: Patch) -> Patch:
        bn, space = self.bn, x.space
        if x.data.is_meta:  # the dry run wants shapes, and meta batch norm costs 4 ms of Python a call
            return x
        if not self.training or not space.split:
            return Patch(bn(x.data), x.rows, x.cols, x.extent, space)
        acc = torch.promote_types(x.data.dtype, torch.float32)  # statistics never in fp16
        own = x.crop(*space.own(x.extent)).data.to(acc)
        sums = torch.stack([own.sum(dim=(0, 2, 3)), (own * own).sum(dim=(0, 2, 3))])
        count = own.shape[0] * x.extent[0] * x.extent[1]
        sums = space.all_reduce(sums)
        mean = sums[0] / count
        var = sums[1] / count - mean * mean
        with torch.no_grad():
            bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean.detach())
            bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var.detach() * count / (count - 1))
            bn.num_batches_tracked += 1
        scale = bn.weight.to(acc) * torch.rsqrt(var + bn.eps)
        shift = bn.bias.to(acc) - mean * scale
        y = x.data * scale.to(x.data.dtype)[:, None, None] + shift.to(x.data.dtype)[:, None, None]
        return Patch(y, x.rows, x.cols, x.extent, space)


class ReLU(Layer):
    """Pointwise ReLU."""

    def forward(self, x: Patch) -> Patch:
        if x.data.is_meta:  # shapes only (the dry run): nothing to compute
            return x
        return Patch(F.relu(x.data), x.rows, x.cols, x.extent, x.space)


def add(a: Patch, b: Patch) -> Patch:
    """a + b on the positions both cover (halo-D2 branches may cover different margins)."""
    rows, cols = a.rows.meet(b.rows), a.cols.meet(b.cols)
    a, b = a.crop(rows, cols), b.crop(rows, cols)
    return Patch(a.data + b.data, rows, cols, a.extent, a.space)


def concat(parts: Sequence[Patch]) -> Patch:
    """Channel concatenation on the positions all cover."""
    rows, cols = parts[0].rows, parts[0].cols
    for p in parts[1:]:
        rows, cols = rows.meet(p.rows), cols.meet(p.cols)
    data = torch.cat([p.crop(rows, cols).data for p in parts], dim=1)
    return Patch(data, rows, cols, parts[0].extent, parts[0].space)


class Seq(Layer):
    """Layers in order."""

    def __init__(self, *layers: Layer) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        sh = sw = 1
        for m in layers:
            sh, sw = sh * m.stride[0], sw * m.stride[1]
        self.stride = (sh, sw)

    def forward(self, x: Patch) -> Patch:
        for m in self.layers:
            x = m(x)
        return x

    def need(self, space: Space, spans: Spans, extent: tuple[int, int]) -> Spans:
        for m in reversed(self.layers):
            spans = m.need(space, spans, extent)
            extent = (extent[0] * m.stride[0], extent[1] * m.stride[1])
        return spans


class Identity(Layer):
    """The unchanged patch."""

    def forward(self, x: Patch) -> Patch:
        return x


class Residual(Layer):
    """main(x) + shortcut(x)."""

    def __init__(self, main: Layer, shortcut: Layer | None = None) -> None:
        super().__init__()
        self.main = main
        self.shortcut = shortcut or Identity()
        self.stride = main.stride

    def forward(self, x: Patch) -> Patch:
        return add(self.shortcut(x), self.main(x))

    def need(self, space: Space, spans: Spans, extent: tuple[int, int]) -> Spans:
        a = self.main.need(space, spans, extent)
        b = self.shortcut.need(space, spans, extent)
        return a[0].union(b[0]), a[1].union(b[1])


class Fused(Layer):
    """A halo-D2 group: with `Space.d2`, one exchange as wide as the group reads, valid layers inside,
    then the owned tile; otherwise the layers exchange one by one."""

    def __init__(self, body: Layer) -> None:
        super().__init__()
        self.body = body
        self.stride = body.stride

    def forward(self, x: Patch) -> Patch:
        space = x.space
        if not space.d2 or not space.split or space.valid:
            return self.body(x)
        extent = (x.extent[0] // self.stride[0], x.extent[1] // self.stride[1])
        own = space.own(extent)
        rows, cols = self.body.need(space, own, extent)
        x = space.exchange(x, rows, cols, 0.0)
        with space.fused():
            y = self.body(x)
        return y.crop(*own)

    def need(self, space: Space, spans: Spans, extent: tuple[int, int]) -> Spans:
        return self.body.need(space, spans, extent)
