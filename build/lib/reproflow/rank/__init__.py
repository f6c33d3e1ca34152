"""What runs inside a rank: the worker, the run context, timing and memory probes, health gates, tools."""
