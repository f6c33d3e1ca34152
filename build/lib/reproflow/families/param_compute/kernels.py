"""The measurement of param compute: reproflow's GEMM, EmbeddingBag and MLP kernels, or param's
driver.py, timed on every rank."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from reproflow.families.param_compute import original
from reproflow.families.param_compute.datasets import COORDS, UNITS, shapes, work
from reproflow.rank.context import RunContext
from reproflow.rank.timing import rank_stats, time_steps
from reproflow.spec.family import Measurement


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name, torch.float32)


def _gemm(ctx: RunContext, shape: tuple[int, ...], params: Mapping[str, Any]) -> float:
    m, n, k = shape
    gen = torch.Generator().manual_seed(0)
    dt = _dtype(params["dtype"])
    a = torch.randn(m, k, generator=gen).to(dt).to(ctx.device)
    b = torch.randn(k, n, generator=gen).to(dt).to(ctx.device)
    return time_steps(ctx.sync, lambda: torch.mm(a, b), params["warmups"], params["steps"])


def _emb(ctx: RunContext, shape: tuple[int, ...], params: Mapping[str, Any]) -> float:
    features, dim, nnz, batch = shape
    gen = torch.Generator().manual_seed(0)
    # Made on the device: dataset A's 26M-row tables take many seconds to fill on a CPU and copy over.
    bag = nn.EmbeddingBag(features, dim, mode="sum", device=ctx.device)
    indices = torch.randint(0, features, (batch * nnz,), generator=gen).to(ctx.device)
    offsets = (torch.arange(batch) * nnz).to(ctx.device)
    with torch.no_grad():
        return time_steps(ctx.sync, lambda: bag(indices, offsets), params["warmups"], params["steps"])


def _linear(ctx: RunContext, shape: tuple[int, ...], params: Mapping[str, Any]) -> float:
    layers, width_in, hidden, width_out, batch = shape
    torch.manual_seed(1)
    sizes = [width_in] + [hidden] * layers + [width_out]
    blocks: list[nn.Module] = []
    for a, b in pairwise(sizes):
        blocks += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*blocks, nn.Softmax(dim=1)).to(ctx.device, _dtype(params["dtype"]))
    loss_fn = nn.CrossEntropyLoss()
    opt_name = params["optimizer"]
    opt = None
    if opt_name != "none":
        opt = (torch.optim.SGD if opt_name == "sgd" else torch.optim.Adagrad)(model.parameters(), lr=0.01)
    x = torch.randn(batch, width_in, device=ctx.device).to(_dtype(params["dtype"]))
    y = torch.randint(0, width_out, (batch,), device=ctx.device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(x).float(), y)
        loss.backward()
        if opt is not None:
            opt.step()

    return time_steps(ctx.sync, step, params["warmups"], params["steps"])


KERNEL_FNS: dict[str, Callable[[RunContext, tuple[int, ...], Mapping[str, Any]], float]] = {
    "gemm": _gemm,
    "emb": _emb,
    "linear": _linear,
}


def _own(ctx: RunContext, params: Mapping[str, Any]) -> list[tuple[tuple[int, ...], float]]:
    previous = torch.get_float32_matmul_precision()
    # "tf32" turns on TensorFloat-32 for fp32 storage (param PR #54); CPUs ignore it.
    torch.set_float32_matmul_precision("high" if params["dtype"] == "tf32" else "highest")
    try:
        return [(shape, KERNEL_FNS[params["kernel"]](ctx, shape, params)) for shape in shapes(params)]
    finally:
        torch.set_float32_matmul_precision(previous)


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Measure every shape on every rank (reproflow's kernels or param's driver.py); rows hold
    per-rank times and rates at the p50 time across ranks."""
    kernel = params["kernel"]
    tool: dict[str, str] = {}
    if params["implementation"] == "param":
        timed, tool = original.measure(ctx, params, shapes(params))
    else:
        timed = _own(ctx, params)
    out: list[Measurement] = []
    for shape, seconds in timed:
        per_rank = ctx.gather_floats(seconds)
        p50 = rank_stats(per_rank)["p50"]
        coords = dict(zip(COORDS[kernel], shape, strict=True)) | tool
        out.extend(Measurement("time_s", s, "s", coords, rank=i) for i, s in enumerate(per_rank))
        out.append(Measurement("time_p50_s", p50, "s", coords))
        for metric, amount in work(kernel, shape).items():
            unit, scale = UNITS[metric]
            out.append(Measurement(metric, amount / p50 / scale, unit, coords))
    return out
