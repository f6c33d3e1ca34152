"""The spec: what an experiment is. Errors, parameters, suites, the family protocol and its registry, paths."""
