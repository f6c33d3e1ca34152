"""Experiment families. Each subpackage exports `FAMILY` (a reproflow.family.Family)."""
