"""Run each tiny model's tensor-parallel plan and the same plan with a data-parallel head (whose batch-split
gradient is handed back to tensor-parallel layers) lowered on every rank; print each plan's collectives by
kind and its errors against the unsharded model (rank 0). Then its data-parallel plan with gradient buckets of
16 KiB (the tiny models' gradients fill DDP's first one): how many buckets, and how many of their all-reduces
the backward pass computes past before it waits for them. Launched by test_cfp.py through reproflow's local
launcher."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from torch.distributed.device_mesh import init_device_mesh

from reproflow.families.cfp import execute, passes
from reproflow.rank.context import RunContext


def main() -> None:
    ctx = RunContext.from_env("cpu", "gloo", 120)
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    for model in sys.argv[1].split(","):
        s = passes.Setup(model, "tiny", 0, 8, ctx.world_size, Path("unused"))
        _, cap = passes.global_step(s)
        tp = passes.baseline(cap.analysis, "tensor-parallel")
        for name, choice in (("tp", tp), ("tp-dp-head", [*tp[:-1], 0])):
            low = execute.Lowered(execute.Runner(cap, mesh, execute.assignment(cap.analysis, choice)))
            kinds = Counter(kind for kind, _ in low.collectives())
            got = [o.full_tensor() for o in low.step(update=False).outputs]
            loss_err, grad_err = execute.errors(model, s.config, s.batch_size, float(got[0].detach()), got[1:])
            if ctx.rank == 0:
                print(f"{model} {name} {choice}: all_gather={kinds['all_gather_into_tensor']} "
                      f"collectives={sum(kinds.values())} loss_error={loss_err:.3g} grad_error={grad_err:.3g}",
                      flush=True)
        execute._Buckets.FIRST = execute._Buckets.CAP = 16 << 10
        low = execute.Lowered(execute.Runner(cap, mesh, execute.assignment(
            cap.analysis, passes.baseline(cap.analysis, "data-parallel"))))
        nodes = list(low.graph.graph.nodes)
        matmuls = [i for i, nd in enumerate(nodes) if str(nd.target) in ("aten.mm.default", "aten.addmm.default")]
        reduces = [(i, nodes.index(next(iter(nd.users)))) for i, nd in enumerate(nodes)
                   if "all_reduce" in str(nd.target) and str(nd.args[0].target) == "aten.cat.default"]
        overlapped = sum(any(i < m < w for m in matmuls) for i, w in reduces)
        got = [o.full_tensor() for o in low.step(update=False).outputs]
        loss_err, grad_err = execute.errors(model, s.config, s.batch_size, float(got[0].detach()), got[1:])
        if ctx.rank == 0:
            print(f"{model} dp buckets={len(reduces)} overlapped={overlapped} loss_error={loss_err:.3g} "
                  f"grad_error={grad_err:.3g}", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
