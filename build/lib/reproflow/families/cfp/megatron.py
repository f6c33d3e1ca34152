"""Megatron-LM's tensor parallelism on CFP's models, for DeepSpeed-Megatron, the baseline of CFP's paper.

With t tensor-parallel (TP) ranks, consecutive as Megatron places them (within a node first), and
n / t data-parallel (DP) ones, each model is split as Megatron-LM splits it, on megatron-core's own
layers: attention by heads (qkv column-parallel, the output projection row-parallel), GPT's MLP and
LLaMA's SwiGLU by their width, each expert's feed-forward by its width between Megatron's copy and
reduce regions, the token embedding and the head by the vocabulary, with Megatron's
vocabulary-parallel cross-entropy. Norms, positions and the MoE's gate are replicated. Every weight
starts as the unsharded model's slice (megatron-core's CPU initialisation slices a full weight), so
the first step is checked against the unsharded model like every other plan. torch_baselines.py runs
the result in DeepSpeed's engine with ZeRO-1 and overlapped communication over the DP ranks (`Mpu`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from reproflow.families.cfp import models

with warnings.catch_warnings():  # megatron-core warns of Transformer Engine and Apex, neither used here
    warnings.simplefilter("ignore")
    from megatron.core import ModelParallelConfig
    from megatron.core.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        copy_to_tensor_model_parallel_region,
        reduce_from_tensor_model_parallel_region,
    )
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes


@dataclass(frozen=True)
class Mpu:
    """This rank's TP and DP groups as DeepSpeed's engine asks for them (Megatron-DeepSpeed hands it its
    `mpu` module; these are its methods that the engine and ZeRO call)."""

    tp: dist.ProcessGroup
    dp: dist.ProcessGroup

    def get_model_parallel_group(self) -> dist.ProcessGroup:
        return self.tp

    def get_model_parallel_rank(self) -> int:
        return dist.get_rank(self.tp)

    def get_model_parallel_world_size(self) -> int:
        return dist.get_world_size(self.tp)

    def get_data_parallel_group(self) -> dist.ProcessGroup:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank(self.dp)

    def get_data_parallel_world_size(self) -> int:
        return dist.get_world_size(self.dp)

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size


def groups(t: int) -> Mpu:
    """TP groups of `t` consecutive ranks and DP groups of the ranks at the same place in each (every rank
    creates every group, in the same order, as torch.distributed requires)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    tp = [dist.new_group(list(range(s, s + t))) for s in range(0, n, t)][rank // t]
    dp = [dist.new_group(list(range(f, n, t))) for f in range(t)][rank % t]
    return Mpu(tp, dp)


class _VocabParallelLoss(torch.autograd.Function):
    """Megatron's vocabulary-parallel cross-entropy per token, megatron-core's arithmetic on an explicit
    group (its own function reads the global group of megatron's parallel_state, which is not set here:
    each TP degree screened has its own groups)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, logits: torch.Tensor, target: torch.Tensor,
                group: dist.ProcessGroup) -> torch.Tensor:
        ce = VocabParallelCrossEntropy
        logits, most = ce.calculate_logits_max(logits)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
        start = dist.get_rank(group) * logits.shape[-1]
        mask, masked_1d, predicted, sum_exp, exp = ce.calculate_predicted_logits(
            logits, target, most, start, start + logits.shape[-1])
        dist.all_reduce(predicted, group=group)
        dist.all_reduce(sum_exp, group=group)
        softmax, loss = ce.calculate_cross_entropy_loss(exp, predicted, sum_exp)
        ctx.save_for_backward(softmax, mask, masked_1d)
        return loss

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        softmax, mask, masked_1d = ctx.saved_tensors  # type: ignore[attr-defined]
        ce = VocabParallelCrossEntropy
        grad_2d, arange_1d, update, grad_input = ce.prepare_gradient_calculation_operands(softmax, mask)
        return ce.calculate_gradients(grad_2d, arange_1d, masked_1d, update, grad_input, grad), None, None


class _Linear(nn.Module):
    """A megatron-core linear layer that returns its output alone (they return (output, bias))."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)[0]


class ParallelMoE(models.MoE):
    """The MoE with each expert's feed-forward split by its width: the gate and routing replicated, the
    slots copied into the TP region and the experts' partial outputs reduced out of it."""

    def __init__(self, moe: models.MoE, group: dist.ProcessGroup) -> None:
        nn.Module.__init__(self)  # not MoE's: it would draw full expert weights only to drop them
        self.c = moe.c
        t, r = dist.get_world_size(group), dist.get_rank(group)
        width = moe.wi.shape[-1] // t
        self.gate = moe.gate
        self.wi = nn.Parameter(moe.wi.detach()[:, :, r * width:(r + 1) * width].clone())
        self.wo = nn.Parameter(moe.wo.detach()[:, r * width:(r + 1) * width].clone())
        set_tensor_model_parallel_attributes(self.wi, True, 2, 1)
        set_tensor_model_parallel_attributes(self.wo, True, 1, 1)
        self.group = group

    def experts(self, expert_in: torch.Tensor) -> torch.Tensor:
        x = copy_to_tensor_model_parallel_region(expert_in, group=self.group)
        return reduce_from_tensor_model_parallel_region(super().experts(x), group=self.group)


class ParallelHead(models.Head):
    """The head split by the vocabulary (column-parallel, logits left split) and the cross-entropy over it."""

    def __init__(self, head: models.Head, group: dist.ProcessGroup, layer: nn.Module) -> None:
        nn.Module.__init__(self)  # not Head's: it would build a full head only to drop it
        self.norm, self.head, self.group = head.norm, layer, group

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _VocabParallelLoss.apply(logits, targets, self.group).mean()


def tensor_parallel(module: models.LanguageModel, group: dist.ProcessGroup) -> models.LanguageModel:
    """`module` split in place over the TP `group` as Megatron-LM splits it; returns it."""
    t = dist.get_world_size(group)
    config = ModelParallelConfig(tensor_model_parallel_size=t, use_cpu_initialization=True,
                                 params_dtype=torch.float32, gradient_accumulation_fusion=False,
                                 sequence_parallel=False)

    def init(full: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """megatron-core's init_method: fill the full weight that it then slices."""
        return lambda w: w.copy_(full.detach())

    def column(linear: nn.Linear) -> nn.Module:
        return _Linear(ColumnParallelLinear(
            linear.in_features, linear.out_features, config=config, init_method=init(linear.weight),
            bias=linear.bias is not None, gather_output=False, tp_group=group)).apply(_bias_from(linear, column=True))

    def row(linear: nn.Linear) -> nn.Module:
        return _Linear(RowParallelLinear(
            linear.in_features, linear.out_features, config=config, init_method=init(linear.weight),
            bias=linear.bias is not None, input_is_parallel=True, skip_bias_add=False,
            tp_group=group)).apply(_bias_from(linear, column=False))

    c = module.c
    module.wte = VocabParallelEmbedding(c.vocab_size, c.hidden_size, init_method=init(module.wte.weight),
                                        config=config, tp_group=group)
    for layer in module.layers:
        attention, ffn = layer[0].fn, layer[1].fn
        attention.c = replace(attention.c, num_heads=c.num_heads // t, hidden_size=c.hidden_size // t)
        attention.qkv, attention.proj = column(attention.qkv), row(attention.proj)
        if isinstance(ffn, models.MLP):
            ffn.fc1, ffn.fc2 = column(ffn.fc1), row(ffn.fc2)
        elif isinstance(ffn, models.SwiGLU):
            ffn.w1, ffn.w3, ffn.w2 = column(ffn.w1), column(ffn.w3), row(ffn.w2)
        else:
            layer[1].fn = ParallelMoE(ffn, group)
    module.out = ParallelHead(module.out, group, column(module.out.head))
    return module


def _bias_from(linear: nn.Linear, column: bool) -> Callable[[nn.Module], None]:
    """Copy `linear`'s bias into a megatron layer: its slice (column-parallel) or all of it (row-parallel,
    added after the reduction); megatron-core initialises biases to zero."""
    def copy(m: nn.Module) -> None:
        bias = getattr(m, "bias", None)
        if isinstance(m, ColumnParallelLinear | RowParallelLinear) and bias is not None and linear.bias is not None:
            with torch.no_grad():
                full = linear.bias.detach()
                bias.copy_(full.chunk(m.tp_group.size())[m.tp_group.rank()] if column else full)
    return copy


def full_gradients(module: models.LanguageModel, grads: dict[str, torch.Tensor], group: dist.ProcessGroup,
                   names: list[str]) -> list[torch.Tensor]:
    """The full gradient of every parameter of the unsharded model (its `names`, in order) from this
    rank's `grads` of the split `module`: a split weight's slices gathered over the TP `group`."""
    params = dict(module.named_parameters())
    out = []
    for name in names:
        mine = name if name in params else name.rsplit(".", 1)[0] + ".layer." + name.rsplit(".", 1)[1]
        p, g = params[mine], grads[mine]
        if getattr(p, "tensor_model_parallel", False):
            parts = [torch.empty_like(g) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, g.contiguous(), group=group)
            g = torch.cat(parts, dim=p.partition_dim)  # type: ignore[attr-defined]
        out.append(g.cpu())
    return out
