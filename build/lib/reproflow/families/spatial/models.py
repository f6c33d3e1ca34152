"""ResNet-110-v2 and AmoebaNet-D as sequences of layers that `--balance` splits into partitions.

ResNet-v2 is the Keras CIFAR model (depth 9n+2, pre-activation bottlenecks, the stride on a block's
first 1×1 convolution): first convolution + 36 blocks + head = 38 layers. AmoebaNet-D follows the
GPipe benchmark's genotype (normal concat [0, 3, 4, 6]): stem, two stem reduction cells, three
groups of num_layers/3 normal cells between two reduction cells, classifier = num_layers + 6 layers.
Every layer but the head works on patches, so the first partitions can be spatial.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from reproflow.families.spatial.halo import Patch, Space
from reproflow.families.spatial.layers import (
    AvgPool,
    Conv,
    Fused,
    Identity,
    Layer,
    MaxPool,
    Norm,
    ReLU,
    Residual,
    Seq,
    Spans,
    add,
    concat,
)

State = Patch | tuple[Patch, Patch]


class ResNetHead(nn.Module):
    """BN-ReLU, 8×8 average pooling, flatten, dense: logits."""

    def __init__(self, channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        self.norm, self.relu = Norm(channels), ReLU()
        side = image_size // 4 // 8
        self.fc = nn.Linear(channels * side * side, num_classes)

    def forward(self, x: Patch) -> torch.Tensor:
        y = self.relu(self.norm(x)).data
        return self.fc(torch.nn.functional.avg_pool2d(y, 8).flatten(1))


def resnet_layers(depth: int) -> int:
    """Sequential layers of a ResNet-v2 of `depth` (9n + 2): first convolution, 3n blocks, head."""
    return 3 * ((depth - 2) // 9) + 2


def resnet_v2(depth: int = 110, num_classes: int = 10, image_size: int = 32) -> list[nn.Module]:
    """Keras' ResNet-v2 (bottleneck) as first conv, 3·(depth−2)/9 blocks each in a halo-D2 group, head."""
    blocks = (depth - 2) // 9
    layers: list[nn.Module] = [Seq(Conv(3, 16, 3), Norm(16), ReLU())]
    width, channels = 16, 16
    for stage in range(3):
        out = width * 4 if stage == 0 else width * 2
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            pre: list[Layer] = [] if stage == 0 and b == 0 else [Norm(channels), ReLU()]
            main = Seq(*pre, Conv(channels, width, 1, stride),
                       Norm(width), ReLU(), Conv(width, width, 3),
                       Norm(width), ReLU(), Conv(width, out, 1))
            shortcut = Conv(channels, out, 1, stride) if b == 0 else None
            layers.append(Fused(Residual(main, shortcut)))
            channels = out
        width = out
    layers.append(ResNetHead(channels, num_classes, image_size))
    return layers


def relu_conv_bn(cin: int, cout: int, size: int = 1, stride: int = 1) -> Seq:
    """ReLU, convolution, batch norm."""
    return Seq(ReLU(), Conv(cin, cout, size, stride), Norm(cout))


class FactorizedReduce(Layer):
    """Halves the resolution with two 1×1 stride-2 convolutions, the second shifted one pixel."""

    stride = (2, 2)

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.relu = ReLU()
        self.even = Conv(cin, cout // 2, 1, 2, pad=0)
        self.odd = Conv(cin, cout // 2, 1, 2, pad=-1)
        self.norm = Norm(cout)

    def forward(self, x: Patch) -> Patch:
        x = self.relu(x)
        return self.norm(concat([self.even(x), self.odd(x)]))

    def need(self, space: Space, spans: Spans, extent: tuple[int, int]) -> Spans:
        a, b = self.even.need(space, spans, extent), self.odd.need(space, spans, extent)
        return a[0].union(b[0]), a[1].union(b[1])


def _none(c: int, stride: int) -> Layer:
    return Identity() if stride == 1 else FactorizedReduce(c, c)


def _conv_1x7_7x1(c: int, stride: int) -> Layer:
    q = c // 4
    return Seq(ReLU(), Conv(c, q, 1), Norm(q),
               ReLU(), Conv(q, q, (1, 7), (1, stride), (0, 3)), Norm(q),
               ReLU(), Conv(q, q, (7, 1), (stride, 1), (3, 0)), Norm(q),
               ReLU(), Conv(q, c, 1), Norm(c))


def _conv_3x3(c: int, stride: int) -> Layer:
    q = c // 4
    return Seq(ReLU(), Conv(c, q, 1), Norm(q), ReLU(), Conv(q, q, 3, stride), Norm(q), ReLU(), Conv(q, c, 1), Norm(c))


OPS: dict[str, Callable[[int, int], Layer]] = {
    "none": _none,
    "avg_pool_3x3": lambda c, s: AvgPool(3, s, 1),
    "max_pool_3x3": lambda c, s: MaxPool(3, s, 1),
    "max_pool_2x2": lambda c, s: MaxPool(2, s, 0),
    "conv_1x1": lambda c, s: relu_conv_bn(c, c, 1, s),
    "conv_3x3": _conv_3x3,
    "conv_1x7_7x1": _conv_1x7_7x1,
}
# (input state, operation) pairs; each two make a node, the concatenated nodes are the cell's output.
NORMAL = [(1, "conv_1x1"), (1, "max_pool_3x3"), (1, "none"), (0, "conv_1x7_7x1"), (0, "conv_1x1"),
          (0, "conv_1x7_7x1"), (2, "max_pool_3x3"), (2, "none"), (1, "avg_pool_3x3"), (5, "conv_1x1")]
NORMAL_CONCAT = (0, 3, 4, 6)
REDUCTION = [(0, "max_pool_2x2"), (0, "max_pool_3x3"), (2, "none"), (1, "conv_3x3"), (2, "conv_1x7_7x1"),
             (2, "max_pool_3x3"), (3, "none"), (1, "max_pool_2x2"), (2, "avg_pool_3x3"), (3, "conv_1x1")]
REDUCTION_CONCAT = (4, 5, 6)


class Cell(nn.Module):
    """An AmoebaNet cell on (previous, previous-but-one) states; returns (output, previous).

    With halo-D2 each of its two inputs is exchanged once, as wide as the whole cell reads, instead
    of once per convolution and pooling inside it.
    """

    def __init__(self, c_pp: int, c_p: int, c: int, reduction: bool, reduction_prev: bool) -> None:
        super().__init__()
        self.reduce1 = relu_conv_bn(c_p, c)
        self.reduce2: Layer = (FactorizedReduce(c_pp, c) if reduction_prev
                               else relu_conv_bn(c_pp, c) if c_pp != c else Identity())
        genotype, self.concat = (REDUCTION, REDUCTION_CONCAT) if reduction else (NORMAL, NORMAL_CONCAT)
        self.inputs = [i for i, _ in genotype]
        self.ops = nn.ModuleList(OPS[name](c, 2 if reduction and i < 2 else 1) for i, name in genotype)
        self.scale = 2 if reduction else 1

    def _body(self, s1: Patch, s2: Patch) -> Patch:
        states = [self.reduce1(s1), self.reduce2(s2)]
        for k in range(0, len(self.ops), 2):
            states.append(add(self.ops[k](states[self.inputs[k]]), self.ops[k + 1](states[self.inputs[k + 1]])))
        return concat([states[i] for i in self.concat])

    def need(self, space: Space, extent: tuple[int, int]) -> tuple[Spans, Spans]:
        """Spans of (s1, s2) the owned output tile of an output image `extent` reads."""
        inner = (extent[0] * self.scale, extent[1] * self.scale)
        own = space.own(extent)
        needs: list[Spans | None] = [None] * (2 + len(self.ops) // 2)
        for i in self.concat:
            needs[i] = own
        for k in reversed(range(0, len(self.ops), 2)):
            node = needs[2 + k // 2]
            if node is None:
                continue
            for j in (k, k + 1):
                src = self.inputs[j]
                got = self.ops[j].need(space, node, extent)
                prev = needs[src]
                needs[src] = got if prev is None else (got[0].union(prev[0]), got[1].union(prev[1]))
        s1 = self.reduce1.need(space, needs[0] or space.own(inner), inner)  # at least own: it is the skip output
        s2 = self.reduce2.need(space, needs[1] or space.own(inner), inner)
        return s1, s2

    def forward(self, states: State) -> tuple[Patch, Patch]:
        s1, s2 = states if isinstance(states, tuple) else (states, states)
        space = s1.space
        if not space.d2 or not space.split or space.valid:
            return self._body(s1, s2), s1
        extent = (s1.extent[0] // self.scale, s1.extent[1] // self.scale)
        n1, n2 = self.need(space, extent)
        x1 = space.exchange(s1, *n1, 0.0)
        x2 = x1 if s2 is s1 and n1 == n2 else space.exchange(s2, *n2, 0.0)
        with space.fused():
            out = self._body(x1, x2)
        return out.crop(*space.own(extent)), s1


class Classify(nn.Module):
    """Global average pooling and a dense layer on the cell output."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, states: State) -> torch.Tensor:
        x = states[0] if isinstance(states, tuple) else states
        return self.fc(x.data.mean(dim=(2, 3)))


def amoebanet_d(num_layers: int = 18, num_filters: int = 416, num_classes: int = 10) -> list[nn.Module]:
    """AmoebaNet-D: num_layers + 6 layers (stem, 2 stem reductions, 3 × num_layers/3 normal cells, 2
    reductions between them, classifier)."""
    channels = num_filters // 4
    state = {"pp": channels, "p": channels, "c": channels, "reduction_prev": False}

    def cell(reduction: bool) -> Cell:
        if reduction:
            state["c"] *= 2
        made = Cell(state["pp"], state["p"], state["c"], reduction, bool(state["reduction_prev"]))
        state["pp"], state["p"] = state["p"], state["c"] * len(made.concat)
        state["reduction_prev"] = reduction
        return made

    layers: list[nn.Module] = [Seq(ReLU(), Conv(3, channels, 3, 2), Norm(channels)), cell(True), cell(True)]
    for group in range(3):
        layers += [cell(False) for _ in range(num_layers // 3)]
        if group < 2:
            layers.append(cell(True))
    layers.append(Classify(state["p"], num_classes))
    return layers


def total_stride(layers: list[nn.Module]) -> int:
    """How much the spatial layers among `layers` shrink the image along one axis."""
    s = 1
    for m in layers:
        if isinstance(m, Layer):
            s *= max(m.stride)
        elif isinstance(m, Cell):
            s *= m.scale
    return s
