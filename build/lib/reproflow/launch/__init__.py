"""Launching: local process groups, emulated links, sbatch rendering, submitit, images, retries, status."""
