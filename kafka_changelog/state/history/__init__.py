"""An application's checkpoints over time: completing them and collecting what subsumed
ones leave behind (the coordinator), rewinding, forking, and forgetting input offsets.

Above :mod:`~kafka_changelog.state.backend`; beside ``host``, which it never imports.
"""
