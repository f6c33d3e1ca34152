"""Aceso (EuroSys'24): profile -> search (iterative bottleneck alleviation) -> train.

This package holds the model zoo and op granularity (models.py), the profiled database in the
reference's format (database.py), the performance model (costmodel.py), config JSON and the
Megatron-LM uniform plans (plans.py), the search (search.py) and its command line (cli.py).
"""

from reproflow.families.aceso.cli import register_cli

__all__ = ["register_cli"]
