"""Wide-ResNet's ops at Aceso's granularity, each runnable alone on `tp` ranks.

The stem (conv1, bn1, relu1, maxpool), then per bottleneck block `block-i-j-` conv1 (1x1), bn1,
conv2 (3x3, stride 2 in the first block of stages 2-4), bn2, conv3 (1x1), bn3, downsample (the
residual add, with a 1x1 projection of the block input where shapes change) and relu, then avgpool
and fc. Widths: stage k has planes base * 2^k, bottleneck width planes x width factor, output
planes x 4: conv1 maps to planes, conv2 widens to planes x width, conv3 to planes x 4 (the shapes of
the reference's database). Convolutions are tensor-parallel: algo 0 splits the output channels and all-gathers
them, algo 1 splits the input channels and all-reduces (the stem's conv1, with 3 input channels,
always uses algo 0). The block input travels with the block's ops to the downsample op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reproflow.families.aceso.tp import BuiltOp, Maker, copy, gather_channels, reduce

CLASSES = 1000


@dataclass(frozen=True)
class Dims:
    blocks: tuple[int, ...]
    base: int
    width: int
    image: int


@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # conv, bn, relu, maxpool, downsample, avgpool, fc
    c_in: int
    c_out: int
    size_in: int  # spatial side of the input
    kernel: int = 1
    stride: int = 1
    carry: tuple[int, int] | None = None  # (channels, side) of the block input carried along
    project: bool = False  # downsample with a 1x1 projection (stride = `stride`)


def op_list(d: Dims) -> list[Op]:
    """Every op of the model in order, with its shapes."""
    side = d.image // 2
    ops = [Op("conv1", "conv", 3, d.base, d.image, 7, 2), Op("bn1", "bn", d.base, d.base, side),
           Op("relu1", "relu", d.base, d.base, side), Op("maxpool", "maxpool", d.base, d.base, side)]
    side //= 2
    c = d.base
    for i, n in enumerate(d.blocks):
        planes = d.base * 2**i
        width, out = planes * d.width, planes * 4
        for j in range(n):
            stride = 2 if (j == 0 and i > 0) else 1
            carry = (c, side)
            p = f"block-{i}-{j}-"
            s2 = side // stride
            ops += [Op(p + "conv1", "conv", c, planes, side, 1, 1, carry),
                    Op(p + "bn1", "bn", planes, planes, side, carry=carry),
                    Op(p + "conv2", "conv", planes, width, side, 3, stride, carry),
                    Op(p + "bn2", "bn", width, width, s2, carry=carry),
                    Op(p + "conv3", "conv", width, out, s2, 1, 1, carry),
                    Op(p + "bn3", "bn", out, out, s2, carry=carry),
                    Op(p + "downsample", "downsample", out, out, s2, 1, stride, carry, project=(j == 0)),
                    Op(p + "relu", "relu", out, out, s2)]
            c, side = out, s2
    ops += [Op("avgpool", "avgpool", c, c, side), Op("fc", "fc", c, CLASSES, 1)]
    return ops


def _conv(op: Op, tp: int, algo: int, param: Callable[..., torch.nn.Parameter],
          pad: int) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[torch.nn.Parameter], int]:
    """A TP convolution: (function, weights, input channels it takes)."""
    if tp == 1 or algo == 0 or op.name == "conv1":  # the stem's 3 input channels are never split
        w = param(op.c_out // tp, op.c_in, op.kernel, op.kernel)
        return lambda x: gather_channels(F.conv2d(copy(x, tp), w, stride=op.stride, padding=pad), tp), [w], op.c_in
    w = param(op.c_out, op.c_in // tp, op.kernel, op.kernel)
    return lambda x: reduce(F.conv2d(x, w, stride=op.stride, padding=pad), tp), [w], op.c_in // tp


def build(op: Op, mbs: int, tp: int, algo: int, device: torch.device, dtype: torch.dtype) -> BuiltOp:
    """The op with its inputs for micro-batch `mbs` on `tp` ranks with partition `algo`."""
    b = mbs

    make = Maker(device, dtype)
    param = make.param

    def act(c: int, side: int) -> torch.Tensor:
        return make.act(b, c, side, side)

    carried = [act(*op.carry)] if op.carry is not None else []
    starts_block = op.name.endswith("-conv1") and op.name.startswith("block")
    if op.kind == "conv":
        f, params, c_in = _conv(op, tp, algo, param, op.kernel // 2)
        x = act(c_in, op.size_in)
        if starts_block:  # the block input is the main input; it travels on as the residual
            return BuiltOp(lambda x: (f(x), x), [x], params)
        return BuiltOp(lambda x, *r: (f(x), *r), [x, *carried], params)
    if op.kind == "bn":
        w, bias = param(op.c_out), param(op.c_out)
        mean = torch.zeros(op.c_out, device=device, dtype=dtype)
        var = torch.ones(op.c_out, device=device, dtype=dtype)
        return BuiltOp(lambda x, *r: (F.batch_norm(x, mean, var, w, bias, training=True), *r),
                       [act(op.c_in, op.size_in), *carried], [w, bias])
    if op.kind == "relu":
        return BuiltOp(lambda x: (F.relu(x),), [act(op.c_in, op.size_in)], [])
    if op.kind == "maxpool":
        return BuiltOp(lambda x: (F.max_pool2d(x, 3, 2, 1),), [act(op.c_in, op.size_in)], [])
    if op.kind == "downsample":
        assert op.carry is not None
        if op.project:
            proj = Op(op.name, "conv", op.carry[0], op.c_out, op.carry[1], 1, op.stride)
            f, params, c_in = _conv(proj, tp, algo, param, 0)
            residual = act(c_in, op.carry[1])
            return BuiltOp(lambda x, r: (x + f(r),), [act(op.c_in, op.size_in), residual], params)
        return BuiltOp(lambda x, r: (x + r,), [act(op.c_in, op.size_in), *carried], [])
    if op.kind == "avgpool":
        return BuiltOp(lambda x: (F.adaptive_avg_pool2d(x, 1).flatten(1),), [act(op.c_in, op.size_in)], [])
    w, bias = param(CLASSES, op.c_in), param(CLASSES)
    labels = torch.randint(0, CLASSES, (b,), device=device)
    x = torch.randn(b, op.c_in, device=device, dtype=dtype, requires_grad=True)
    return BuiltOp(lambda x: (F.cross_entropy(F.linear(x, w, bias).float(), labels),), [x], [w, bias])
