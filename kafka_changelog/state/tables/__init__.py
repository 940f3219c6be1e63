"""The working copy: what a keyed state table must do (``protocol``), the in-memory
table, the current key's buffered changes and the state objects a function calls.

Imports only :mod:`~kafka_changelog.state.schema` (and the shared errors).
"""
