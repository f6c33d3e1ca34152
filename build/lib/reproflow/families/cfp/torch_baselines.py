"""PyTorch's, Megatron-LM's and DeepSpeed's parallelism as baselines: DistributedDataParallel, FSDP2
(fully_shard per layer), Megatron-LM's tensor parallelism (megatron.py) with DDP over the data-parallel
ranks, DeepSpeed's ZeRO stages 1, 2 and 3, and DeepSpeed-Megatron (the same tensor parallelism in
DeepSpeed's engine with ZeRO-1 over the data-parallel ranks).

Each trains the nn.Module itself (no captured graph) on its data-parallel rank's slice of the batch with
SGD at the runner's learning rate; the mean of the ranks' losses is the global batch's loss, and the
averaged or sharded gradients are the unsharded model's, which `check` verifies. Every ZeRO stage runs
with `overlap_comm` (gradients reduced in buckets during the backward pass, as DeepSpeed's guides
configure it; on CPUs DeepSpeed has no streams, so a bucket's reduction runs when it fills). DeepSpeed
is an optional extra (`pip install .[deepspeed]`); on CPUs it talks gloo. Its shared-memory op, which it
would compile on first use (a C++ compiler and Python's headers), is left out: it serves only
inference_all_reduce, and ZeRO's training collectives are torch.distributed's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from reproflow.families.cfp import models
from reproflow.families.cfp.execute import LR, errors

if TYPE_CHECKING:
    from reproflow.families.cfp.megatron import Mpu


# Plan names: Megatron-LM's tensor parallelism at a degree, alone (data parallelism over the rest by DDP, as
# Megatron-LM's own) or in DeepSpeed's engine: this prefix, then the degree.
MEGATRON, DEEPSPEED_MEGATRON = "megatron-tp", "deepspeed-megatron-tp"


def _installed(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def deepspeed_available(megatron: bool = False) -> bool:
    """Whether DeepSpeed is installed (the zero baselines need it), and with `megatron` megatron-core too."""
    return _installed("deepspeed", *(["megatron.core"] if megatron else []))


def megatron_available() -> bool:
    """Whether megatron-core is installed (the megatron baseline needs it)."""
    return _installed("megatron.core")


def tp_degrees(model: str, c: models.ModelConfig, n: int) -> list[int]:
    """Megatron-LM's tensor-parallel degrees on `n` ranks: those above 1 that divide the ranks and every
    dimension Megatron splits (heads, vocabulary, feed-forward width)."""
    widths = [c.num_heads, c.vocab_size, c.ffn if model == "llama" else 4 * c.hidden_size]
    return [t for t in range(2, n + 1) if n % t == 0 and all(w % t == 0 for w in widths)]


class ModuleRunner:
    """One training step of the wrapped model on this rank's batch slice, timed like execute.Runner."""

    def __init__(self, kind: str, model: str, c: models.ModelConfig, batch_size: int, mesh: DeviceMesh) -> None:
        device = torch.device(mesh.device_type)
        self.module = models.build(model, c)
        self.names = [name for name, _ in self.module.named_parameters()]  # the unsharded model's order
        self.kind = kind
        self.mpu: Mpu | None = None
        tp = int(kind.rsplit("-tp", 1)[1]) if kind.startswith((MEGATRON, DEEPSPEED_MEGATRON)) else 1
        if tp > 1:
            from reproflow.families.cfp import megatron  # megatron-core: an optional extra, slow to import

            self.mpu = megatron.groups(tp)
            megatron.tensor_parallel(self.module, self.mpu.tp)
        self.module.to(device)
        # Data-parallel ranks take slices of the batch; the ranks of one TP group share theirs.
        dp, index = dist.get_world_size() // tp, dist.get_rank() // tp
        tokens, targets = models.batch(c, batch_size)
        per = batch_size // dp
        self.tokens = tokens[index * per:(index + 1) * per].to(device)
        self.targets = targets[index * per:(index + 1) * per].to(device)
        self._grads: list[torch.Tensor] | None = None
        if kind == "ddp" or kind.startswith(MEGATRON):
            dp_group = self.mpu.dp if self.mpu else None
            self.wrapped: torch.nn.Module = (DistributedDataParallel(self.module, process_group=dp_group)
                                             if dist.get_world_size(dp_group) > 1 else self.module)
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
            self.config = {"train_batch_size": batch_size, "train_micro_batch_size_per_gpu": per,
                           "zero_optimization": {"stage": 1 if tp > 1 else int(kind[-1]), "overlap_comm": True},
                           "steps_per_print": 2**31, "wall_clock_breakdown": False,
                           "zero_allow_untested_optimizer": True}  # plain SGD
            sgd = torch.optim.SGD(self.module.parameters(), lr=LR)
            self._own_groups()
            self.wrapped, self.optimizer, _, _ = deepspeed.initialize(model=self.module, optimizer=sgd,
                                                                      config=self.config, mpu=self.mpu)

    def step(self, update: bool = True) -> tuple[float, float]:
        """(seconds, the global batch's loss)."""
        dist.barrier()
        t0 = time.perf_counter()
        if self.deepspeed:
            self._own_groups()
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

    @property
    def deepspeed(self) -> bool:
        return self.kind.startswith(("zero", DEEPSPEED_MEGATRON))

    def _own_groups(self) -> None:
        """Point DeepSpeed at this runner's groups: an engine hands its mpu to a module-level variable that
        later engines and ZeRO's steps query, and the runners of one search take turns in one process."""
        from deepspeed.utils import groups

        groups.mpu = self.mpu

    def _deepspeed_grads(self) -> list[torch.Tensor]:
        from deepspeed.utils import safe_get_full_grad

        return self._full({name: safe_get_full_grad(p).detach().clone() for name, p in self.module.named_parameters()})

    def _full(self, grads: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Gradients by parameter name, in the unsharded model's order; a tensor-parallel slice gathered."""
        if self.mpu is None:
            return [grads[name].cpu() for name in self.names]
        from reproflow.families.cfp import megatron

        return megatron.full_gradients(self.module, grads, self.mpu.tp, self.names)

    def gradients(self) -> list[torch.Tensor]:
        """The full gradient of every parameter, in the unsharded model's order (after a step without update)."""
        if self.deepspeed:
            return self._grads or []
        return self._full({name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
                           for name, p in self.module.named_parameters()})


def check(runner: ModuleRunner, model: str, c: models.ModelConfig, batch_size: int) -> tuple[float, float]:
    """(absolute loss error, largest relative gradient error) of one step against the unsharded model."""
    _, loss = runner.step(update=False)
    return errors(model, c, batch_size, loss, runner.gradients())
