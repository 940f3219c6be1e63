"""What a checkpoint records and where: completed checkpoints, the checkpoint store,
a subtask's committed part, the driver's claim, input progress and recorded time.

Imports only :mod:`~kafka_changelog.state.snapshots` and below.
"""
