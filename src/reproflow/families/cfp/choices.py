"""What a CFP point can name: its pass, its model and the baselines run beside its plan."""

MODES = ("analysis", "profile", "search", "enum")
MODELS = ("gpt", "moe", "llama")
TORCH_BASELINES = ("ddp", "fsdp2", "zero1", "zero2", "zero3")  # torch_baselines.py's, named here: it imports DTensor
BASELINES = ("alpa", "data-parallel", "tensor-parallel", *TORCH_BASELINES)
# The baselines a screen keeps one of each: the fastest measured stands for its kind (Alpa's integer
# program; the hand-written plans in CFP's runtime; PyTorch's; DeepSpeed's).
KINDS = (("alpa",), ("data-parallel", "tensor-parallel"), ("ddp", "fsdp2"), ("zero1", "zero2", "zero3"))
