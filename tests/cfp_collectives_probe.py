"""Run each tiny model's tensor-parallel plan and the same plan with a data-parallel head (whose batch-split
gradient is handed back to tensor-parallel layers) lowered on every rank; print each plan's collectives by
kind and its errors against the unsharded model (rank 0). Launched by test_cfp.py through reproflow's local
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
    ctx.close()


if __name__ == "__main__":
    main()
