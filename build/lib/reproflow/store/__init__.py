"""Results on disk: the long-format row schema, per-point files with provenance, the archive."""
