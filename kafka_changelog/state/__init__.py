"""Keyed and operator state over the changelog, materialization, checkpoints and restore."""
