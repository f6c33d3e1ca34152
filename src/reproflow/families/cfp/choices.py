"""What a CFP point can name: its pass, its model and the baselines run beside its plan."""

MODES = ("analysis", "profile", "search", "enum")
MODELS = ("gpt", "moe", "llama")
TORCH_BASELINES = ("ddp", "fsdp2", "zero1", "zero2", "zero3")  # torch_baselines.py's, named here: it imports DTensor
BASELINES = ("alpa", "data-parallel", "tensor-parallel", *TORCH_BASELINES)
