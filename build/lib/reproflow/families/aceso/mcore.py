"""The runtime's linear ops on Megatron-LM's own tensor-parallel layers (megatron-core).

With `tp_impl = "megatron-core"` every column- or row-parallel linear op of GPT and T5 (qkv, dense,
MLP GEMMs, whichever partition algorithm the config gives them) runs as megatron-core's
`ColumnParallelLinear` / `RowParallelLinear` on the op's own TP group, initialised from the same
full weight as reproflow's layer (megatron-core's CPU initialisation slices a master weight the way
reproflow does), so both implementations train the same numbers. megatron-core 0.16.1 is the newest
release for Python 3.11; it runs on gloo without Transformer Engine or Apex.
"""

from __future__ import annotations

import inspect
import warnings

import torch

from reproflow.families.aceso.tp import Group, OpDef
from reproflow.spec.errors import ParamError


def available() -> None:
    """Raise ParamError naming the fix when megatron-core cannot be imported."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.tensor_parallel import ColumnParallelLinear
    except ImportError as exc:
        raise ParamError(f"'tp_impl' = 'megatron-core' but megatron-core is not installed ({exc}).",
                         "pip install 'megatron-core==0.16.1' (make installs it), or tp_impl = 'reproflow'") from None
    if "tp_group" not in inspect.signature(ColumnParallelLinear.__init__).parameters:
        raise ParamError("'tp_impl' = 'megatron-core' needs layers that take a tp_group (each op has its own TP "
                         "group); this megatron-core's do not.", "megatron-core 0.16.1, or tp_impl = 'reproflow'")


def linear(op: OpDef, tp: Group, seed: int, device: torch.device,
           dtype: torch.dtype) -> tuple[OpDef, dict[str, torch.nn.Parameter]] | None:
    """`op` on a megatron-core layer and its parameters, or None when `op` is not a TP linear op."""
    w = op.weights.get("weight")
    if set(op.weights) != {"weight", "bias"} or w is None or len(w.shape) != 2 or w.split is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import ModelParallelConfig
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    config = ModelParallelConfig(tensor_model_parallel_size=tp.size, use_cpu_initialization=True,
                                 params_dtype=dtype, gradient_accumulation_fusion=False, sequence_parallel=False)
    full = w.full(seed)

    def init(t: torch.Tensor) -> torch.Tensor:
        return t.copy_(full)

    n_out, n_in = w.shape
    if w.split == 0:
        module = ColumnParallelLinear(n_in, n_out, config=config, init_method=init, bias=True, gather_output=False,
                                      tp_group=tp.pg)
    else:
        module = RowParallelLinear(n_in, n_out, config=config, init_method=init, bias=True, input_is_parallel=True,
                                   skip_bias_add=False, tp_group=tp.pg)
    module.to(device)

    def forward(env: object, weights: object, x: torch.Tensor, *carried: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (module(x)[0], *carried)
    return OpDef(op.name, op.ins, op.outs, {}, forward, op.data), dict(module.named_parameters())
