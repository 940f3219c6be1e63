"""Host-local subtask state: stores on local disk that any process on the host
reattaches, their cleanup, materialization away from the task, and how a task acquires
its subtask's backend.

Above :mod:`~kafka_changelog.state.backend`; beside ``history``, which it never imports.
"""
