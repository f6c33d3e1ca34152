"""Experiment families. Each subpackage exports `FAMILY` (a reproflow.spec.family.Family)."""
