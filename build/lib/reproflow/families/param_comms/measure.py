"""reproflow's own sweep of one collective (the default implementation): buffers, timing, the check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from reproflow.families.param_comms.sweep import DTYPES, bus_factor, element_counts, message_sizes
from reproflow.rank.context import ALL_GATHER, REDUCE_SCATTER, RunContext
from reproflow.rank.timing import STATS, rank_stats, time_per_op
from reproflow.spec.family import Measurement

TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


class _Buffers:
    """The tensors of one collective at one size, and the call that issues it once."""

    def __init__(self, collective: str, total: int, per_rank: int, dtype: torch.dtype, ctx: RunContext,
                 root: int) -> None:
        self.collective, self.ctx, self.root = collective, ctx, root
        dev = ctx.device
        if dtype.is_floating_point:
            make = lambda n: torch.rand(n, device=dev).to(dtype) / ctx.world_size  # noqa: E731
        else:
            make = lambda n: torch.randint(0, 10, (n,), device=dev, dtype=dtype)  # noqa: E731
        if collective == "all_gather":
            self.inp, self.out = make(per_rank), torch.empty(total, dtype=dtype, device=dev)
        elif collective == "reduce_scatter":
            self.inp, self.out = make(total), torch.empty(per_rank, dtype=dtype, device=dev)
        elif collective in ("all_to_all", "send_recv"):
            self.inp, self.out = make(total), torch.empty(total, dtype=dtype, device=dev)
        else:
            self.inp = self.out = make(total)

    def issue(self, async_op: bool) -> Any:
        c, r = self.collective, self.ctx
        if c == "all_reduce":
            return dist.all_reduce(self.inp, async_op=async_op)
        if c == "all_gather":
            return ALL_GATHER(self.out, self.inp, async_op=async_op)
        if c == "reduce_scatter":
            return REDUCE_SCATTER(self.out, self.inp, async_op=async_op)
        if c == "all_to_all":
            return dist.all_to_all_single(self.out, self.inp, async_op=async_op)
        if c == "broadcast":
            return dist.broadcast(self.inp, src=self.root, async_op=async_op)
        if c == "reduce":
            return dist.reduce(self.inp, dst=self.root, async_op=async_op)
        ops = [
            dist.P2POp(dist.isend, self.inp, (r.rank + 1) % r.world_size),
            dist.P2POp(dist.irecv, self.out, (r.rank - 1) % r.world_size),
        ]
        works = dist.batch_isend_irecv(ops)
        if async_op:
            return works
        for w in works:
            w.wait()
        return None

    def count_errors(self) -> int:
        """Fill known values, run the collective once, and count wrong output elements (-c in nccl-tests)."""
        c, r = self.collective, self.ctx
        w, me = r.world_size, r.rank
        per = self.out.numel() // w if c in ("all_gather", "all_to_all") else 0
        if c == "all_to_all":
            # Rank r sends chunk j filled with r*w + j; rank r then holds chunk j = j*w + r.
            self.inp.copy_(torch.arange(w, device=r.device).repeat_interleave(per) + me * w)
            expected = torch.arange(w, device=r.device).repeat_interleave(per) * w + me
        elif c == "broadcast":
            self.inp.fill_(3 if me == self.root else 0)
            expected = torch.full_like(self.inp, 3, dtype=torch.float64)
        elif c == "send_recv":
            self.inp.fill_(me + 1)
            expected = torch.full((self.out.numel(),), (me - 1) % w + 1, device=r.device)
        elif c == "all_gather":
            self.inp.fill_(me + 1)
            expected = torch.arange(1, w + 1, device=r.device).repeat_interleave(per)
        else:
            self.inp.fill_(me + 1)
            expected = torch.full((self.out.numel(),), w * (w + 1) / 2, device=r.device)
        self.issue(False)
        r.sync()
        if c == "reduce" and me != self.root:
            return 0  # only the root's buffer is defined after a reduce
        got = self.out.to(torch.float64)
        tol = 1e-2 if self.out.dtype in (torch.float16, torch.bfloat16) else 1e-6
        return int((~torch.isclose(got, expected.to(torch.float64), rtol=tol, atol=0)).sum().item())


def measure(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """reproflow's own sweep; every rank runs this, rank 0's rows are kept."""
    collective, dtype_name = params["collective"], params["dtype"]
    dtype = TORCH_DTYPES[dtype_name]
    element_size = torch.empty(0, dtype=dtype).element_size()
    factor = bus_factor(collective, ctx.world_size)
    out: list[Measurement] = []
    for size in message_sizes(params["begin_size"], params["end_size"], params["step_factor"],
                              params["step_bytes"]):
        total, per_rank = element_counts(collective, size, element_size, ctx.world_size)
        bufs = _Buffers(collective, total, per_rank, dtype, ctx, params["root"])
        seconds = time_per_op(ctx, bufs.issue, params["warmup_iters"], params["iters"], params["blocking"])
        per_rank_s = ctx.gather_floats(seconds)
        stats = rank_stats(per_rank_s)
        nbytes = total * element_size
        algbw = nbytes / stats["p50"] / 1e9
        coords = {"size_bytes": nbytes, "elements_per_rank": per_rank}
        out.extend(Measurement("time_us", s * 1e6, "us", coords, rank=i) for i, s in enumerate(per_rank_s))
        out.extend(Measurement(f"latency_{k}_us", stats[k] * 1e6, "us", coords) for k in STATS)
        out.append(Measurement("algbw", algbw, "GB/s", coords))
        out.append(Measurement("busbw", algbw * factor, "GB/s", coords))
        if params["check"]:
            wrong = sum(int(x) for x in ctx.gather_floats(float(bufs.count_errors())))
            out.append(Measurement("wrong_elements", float(wrong), "count", coords))
        del bufs
    return out
