"""`reproflow reproduce`: every family's small suites, one command, here or on Slurm, then the report.

The plan is data (`workflows/reproduce/targets.toml`): steps are reproflow command lines, targets are
the papers' figures and tables with the steps that measure them. Each step runs as a child process
whose output goes to `<logs>/reproduce/<step>.log`; its progress events (the workers' points, the jobs
submitted) drive one live display: points done / total, the current point, elapsed time and an estimate
of the time left, from this machine's earlier runs or the plan's estimates. Steps skip what is
measured already, so a rerun runs only what is missing.

In the order it runs: plan.py (the plan as data), estimate.py (what it will cost), steps.py (each
step as a child process, followed through its events), progress.py (the display), resample.py (more
samples for inconclusive claims); run.py strings them together.
"""
