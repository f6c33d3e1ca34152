"""reproflow: reproduce distributed deep-learning systems experiments on Slurm or locally."""

__version__ = "0.1.0"
