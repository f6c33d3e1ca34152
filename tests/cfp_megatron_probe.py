"""Build Megatron-LM's tensor parallelism on every rank for each of CFP's tiny models at the TP degrees
given, alone (DDP over the data-parallel ranks) and in DeepSpeed's engine with ZeRO-1, check each first
step against the unsharded model and print the largest errors (rank 0). Launched by test_cfp.py through
reproflow's local launcher."""

from __future__ import annotations

import sys

from torch.distributed.device_mesh import init_device_mesh

from reproflow.families.cfp import models, torch_baselines
from reproflow.rank.context import RunContext


def main() -> None:
    ctx = RunContext.from_env("cpu", "gloo", 120)
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    for model in ("gpt", "moe", "llama"):
        c = models.config_of(model, "tiny")
        for kind in (torch_baselines.MEGATRON, torch_baselines.DEEPSPEED_MEGATRON):
            for t in map(int, sys.argv[1].split(",")):
                runner = torch_baselines.ModuleRunner(f"{kind}{t}", model, c, 8, mesh)
                loss_err, grad_err = torch_baselines.check(runner, model, c, 8)
                local = sum(p.numel() for p in runner.module.parameters())
                if ctx.rank == 0:
                    print(f"{model} {kind}{t}: loss_error={loss_err:.3g} grad_error={grad_err:.3g} "
                          f"local_params={local}", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
