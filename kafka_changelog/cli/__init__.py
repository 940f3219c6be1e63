"""``kafka-changelog``: the operator's command line.

Modules: :mod:`.main` (parsing, dispatch, exit codes), :mod:`.options` (shared
options and client configs), :mod:`.output` (tables, JSON, progress),
:mod:`.readonly` (read-only views of the checkpoint and snapshot topics),
:mod:`.restore` (loading state without writing), and
one module per command group: :mod:`.broker`, :mod:`.applications`
(``applications``, ``checkpoints``), :mod:`.state` (with :mod:`.keyarg` and
:mod:`.values`), :mod:`.verify`, :mod:`.reset`, :mod:`.handles` (``inspect``,
``dump``, ``kcat``, ``topics``).
"""

from .handles import describe_handle, load_handle
from .main import build_parser, main

__all__ = ["build_parser", "describe_handle", "load_handle", "main"]
