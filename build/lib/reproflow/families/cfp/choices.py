"""What a CFP point can name: its pass, its model and the baselines run beside its plan."""

MODES = ("analysis", "profile", "search", "enum")
MODELS = ("gpt", "moe", "llama")
# torch_baselines.py's, named here: it imports DTensor. Megatron-LM and DeepSpeed-Megatron run once per
# tensor-parallel degree, as a plan named by it (megatron-tp2, deepspeed-megatron-tp2, ...).
TORCH_BASELINES = ("ddp", "fsdp2", "megatron", "zero1", "zero2", "zero3", "deepspeed-megatron")
BASELINES = ("alpa", "data-parallel", "tensor-parallel", *TORCH_BASELINES)
# The baselines a screen keeps one of each: the fastest measured stands for its kind (Alpa's integer
# program; the hand-written plans in CFP's runtime; PyTorch's; Megatron-LM's; DeepSpeed's).
KINDS = (("alpa",), ("data-parallel", "tensor-parallel"), ("ddp", "fsdp2"), ("megatron",),
         ("zero1", "zero2", "zero3", "deepspeed-megatron"))


def baseline_of(plan: str) -> str:
    """The baseline a plan name runs: megatron or deepspeed-megatron for each of their TP degrees, else the
    name."""
    for base in ("megatron", "deepspeed-megatron"):
        if plan.startswith(f"{base}-tp"):
            return base
    return plan


def kind_of(plan: str) -> tuple[str, ...] | None:
    """The KINDS entry of a plan (None: CFP's own)."""
    return next((k for k in KINDS if baseline_of(plan) in k), None)
