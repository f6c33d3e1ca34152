"""Aceso (EuroSys'24): profile -> search (iterative bottleneck alleviation) -> train.

The family itself is the op profiler (profile.py, GPT ops in gpt_ops.py): it runs every op on the
job's ranks and records Aceso's database columns as rows. The package also holds the model zoo
(models.py), the database format (database.py), the performance model (costmodel.py), config JSON
and Megatron-LM uniform plans (plans.py), the search (search.py) and `reproflow aceso` (cli.py).
"""

from reproflow.families.aceso.cli import register_cli
from reproflow.families.aceso.profile import check, run, table
from reproflow.family import Family
from reproflow.params import Param

FAMILY = Family(
    name="aceso",
    summary="Aceso op profiler: every op's forward/backward time and sizes on TP ranks (GPT, T5, Wide-ResNet)",
    params=(
        Param("kind", "str", "ops", "what to profile: every op, the collectives, or P2P bandwidth (2 ranks)",
              choices=("ops", "collectives", "p2p")),
        Param("model", "str", "gpt", "model whose ops are profiled", choices=("gpt", "scale-layer", "t5", "resnet")),
        Param("size", "str", "tiny", "model size (Aceso's, or tiny for CPUs)"),
        Param("mbs", "int", 1, "micro-batch size", minimum=1),
        Param("algo", "int", 0, "partition algorithm of the TP ops (0 or 1)", choices=(0, 1)),
        Param("seq_len", "int", 0, "GPT or T5-encoder sequence length, or ResNet image side; 0: the size's",
              minimum=0),
        Param("warmup", "int", 3, "untimed calls per op", minimum=0),
        Param("repeats", "int", 10, "timed calls per op", minimum=1),
        Param("sizes_mb", "str", "0-64", "collectives: whole-MB sizes, e.g. '0-16,32,64'"),
        Param("p2p_max_mb", "int", 64, "p2p: largest message (1, 2, 4, ... MB)", minimum=1),
    ),
    run=run,
    table=table,
    check=check,
    register_cli=register_cli,
)

__all__ = ["FAMILY"]
