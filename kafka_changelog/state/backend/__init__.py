"""The keyed and operator state backends: the changelog keyed backend (working copy and
change log, checkpoints, materialization, TTL expiry and timers), its configuration,
task-local recovery, restore, and bulk access to many keys.

Imports every sub-package below it, never ``host`` or ``history``.
"""
