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

from reproflow.families.aceso.tp import Act, Env, OpDef, Weight, copy, gather, reduce

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


def _conv(op: Op, algo: int, pad: int, x_spec: Act) -> tuple[Weight, Act, Callable[..., torch.Tensor]]:
    """A TP convolution: its weight, the input layout it takes, and f(env, weight, x). Algo 0 splits the
    output channels and all-gathers them; algo 1 splits the input channels and all-reduces."""
    if algo == 0 or op.name == "conv1":  # the stem's 3 input channels are never split
        return (Weight((op.c_out, op.c_in, op.kernel, op.kernel), 0), x_spec,
                lambda env, w, x: gather(F.conv2d(copy(x, env.tp), w, stride=op.stride, padding=pad), env.tp, 1))
    return (Weight((op.c_out, op.c_in, op.kernel, op.kernel), 1), Act(x_spec.shape, 0, 1),
            lambda env, w, x: reduce(F.conv2d(x, w, stride=op.stride, padding=pad), env.tp))


def build(op: Op, mbs: int, algo: int) -> OpDef:
    """The op for micro-batch `mbs` with partition algorithm `algo`."""
    def act(c: int, side: int) -> Act:
        return Act((mbs, c, side, side), 0)

    x_in, y = act(op.c_in, op.size_in), act(op.c_out, op.size_in // op.stride)
    res = act(*op.carry) if op.carry is not None else None
    if op.kind == "conv":
        w, spec, f = _conv(op, algo, op.kernel // 2, x_in)
        if op.name == "conv1":  # the stem reads the images
            images = act(3, op.size_in)
            return OpDef(op.name, (), (y,), {"weight": w}, lambda env, ws: (f(env, ws["weight"], env.data("images")),),
                         {"images": images})
        if op.name.endswith("-conv1"):  # the block input is the main input; it travels on as the residual
            return OpDef(op.name, (spec,), (y, spec), {"weight": w}, lambda env, ws, x: (f(env, ws["weight"], x), x))
        assert res is not None
        return OpDef(op.name, (spec, res), (y, res), {"weight": w},
                     lambda env, ws, x, r: (f(env, ws["weight"], x), r))
    if op.kind == "bn":
        carried = (res,) if res is not None else ()
        return OpDef(op.name, (x_in, *carried), (y, *carried),
                     {"weight": Weight((op.c_out,), None, "ones"), "bias": Weight((op.c_out,), None, "zeros")},
                     lambda env, w, x, *r: (F.batch_norm(x, None, None, w["weight"], w["bias"], training=True), *r))
    if op.kind == "relu":
        return OpDef(op.name, (x_in,), (y,), {}, lambda env, w, x: (F.relu(x),))
    if op.kind == "maxpool":
        return OpDef(op.name, (x_in,), (act(op.c_out, op.size_in // 2),), {},
                     lambda env, w, x: (F.max_pool2d(x, 3, 2, 1),))
    if op.kind == "downsample":
        assert res is not None
        if op.project:  # a 1x1 projection of the block input where the shapes change
            assert op.carry is not None
            w, spec, f = _conv(Op(op.name, "conv", op.carry[0], op.c_out, op.carry[1], 1, op.stride), algo, 0, res)
            return OpDef(op.name, (x_in, spec), (x_in,), {"weight": w},
                         lambda env, ws, x, r: (x + f(env, ws["weight"], r),))
        return OpDef(op.name, (x_in, res), (x_in,), {}, lambda env, w, x, r: (x + r,))
    if op.kind == "avgpool":
        return OpDef(op.name, (x_in,), (Act((mbs, op.c_in), 0),), {},
                     lambda env, w, x: (F.adaptive_avg_pool2d(x, 1).flatten(1),))

    def loss(env: Env, w: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.cross_entropy(F.linear(x, w["weight"], w["bias"]).float(), env.data("labels")),)
    return OpDef(op.name, (Act((mbs, op.c_in), 0),), (Act((), None),),
                 {"weight": Weight((CLASSES, op.c_in)), "bias": Weight((CLASSES,), None, "zeros")}, loss,
                 {"labels": Act((mbs,), 0, None, CLASSES)})
