"""Data parallelism of PyTorch and DeepSpeed as baselines: DistributedDataParallel, FSDP2 (fully_shard per
layer) and DeepSpeed's ZeRO stages 1, 2 and 3.

Each trains the nn.Module itself (no captured graph) on the rank's slice of the batch with SGD at the
runner's learning rate; the mean of the ranks' losses is the global batch's loss, and the averaged or
sharded gradients are the unsharded model's, which `check` verifies. DeepSpeed is an optional extra
(`pip install .[deepspeed]`); on CPUs it talks gloo. Its shared-memory op, which it would compile on
first use (a C++ compiler and Python's headers), is left out: it serves only inference_all_reduce, and
ZeRO's training collectives are torch.distributed's.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from reproflow.families.cfp import models
from reproflow.families.cfp.execute import LR, errors


def deepspeed_available() -> bool:
    """Whether DeepSpeed is installed (the zero baselines need it)."""
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


class ModuleRunner:
    """One training step of the wrapped model on this rank's batch slice, timed like execute.Runner."""

    def __init__(self, kind: str, model: str, c: models.ModelConfig, batch_size: int, mesh: DeviceMesh) -> None:
        device = torch.device(mesh.device_type)
        self.module = models.build(model, c).to(device)
        rank, n = dist.get_rank(), dist.get_world_size()
        tokens, targets = models.batch(c, batch_size)
        per = batch_size // n
        self.tokens = tokens[rank * per:(rank + 1) * per].to(device)
        self.targets = targets[rank * per:(rank + 1) * per].to(device)
        self.kind = kind
        self._grads: list[torch.Tensor] | None = None
        if kind == "ddp":
            self.wrapped: torch.nn.Module = DistributedDataParallel(self.module)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=LR)
        elif kind == "fsdp2":
            for layer in self.module.layers:
                fully_shard(layer, mesh=mesh)
            self.wrapped = fully_shard(self.module, mesh=mesh)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=LR)
        else:
            import deepspeed
            import deepspeed.ops
            from deepspeed.accelerator import get_accelerator

            shm = get_accelerator().create_op_builder("ShareMemCommBuilder")  # None on GPUs
            if shm is not None:
                deepspeed.ops.__compatible_ops__[shm.NAME] = False
            deepspeed.init_distributed(dist_backend=dist.get_backend())
            config = {"train_batch_size": batch_size, "train_micro_batch_size_per_gpu": per,
                      "zero_optimization": {"stage": int(kind[-1])}, "steps_per_print": 2**31,
                      "wall_clock_breakdown": False, "zero_allow_untested_optimizer": True}  # plain SGD
            sgd = torch.optim.SGD(self.module.parameters(), lr=LR)
            self.wrapped, self.optimizer, _, _ = deepspeed.initialize(model=self.module, optimizer=sgd, config=config)

    def step(self, update: bool = True) -> tuple[float, float]:
        """(seconds, the global batch's loss)."""
        dist.barrier()
        t0 = time.perf_counter()
        if self.kind.startswith("zero"):
            loss = self.wrapped(self.tokens, self.targets)
            self.wrapped.backward(loss)  # type: ignore[operator]
            self._grads = self._deepspeed_grads() if not update else None
            if update:
                self.wrapped.step()  # type: ignore[operator]
        else:
            self.optimizer.zero_grad()
            loss = self.wrapped(self.tokens, self.targets)
            loss.backward()
            if update:
                self.optimizer.step()
        value = loss.detach().clone()
        dist.all_reduce(value)
        elapsed = time.perf_counter() - t0
        return elapsed, float(value) / dist.get_world_size()

    def _deepspeed_grads(self) -> list[torch.Tensor]:
        from deepspeed.utils import safe_get_full_grad

        return [safe_get_full_grad(p).detach().cpu().clone() for p in self.module.parameters()]

    def gradients(self) -> list[torch.Tensor]:
        """The full gradient of every parameter, in the module's order (after a step without update)."""
        if self.kind.startswith("zero"):
            return self._grads or []
        out = []
        for p in self.module.parameters():
            g = p.grad
            out.append((g.full_tensor() if isinstance(g, DTensor) else g).cpu())  # type: ignore[union-attr]
        return out


def check(runner: ModuleRunner, model: str, c: models.ModelConfig, batch_size: int) -> tuple[float, float]:
    """(absolute loss error, largest relative gradient error) of one step against the unsharded model."""
    _, loss = runner.step(update=False)
    return errors(model, c, batch_size, loss, runner.gradients())
