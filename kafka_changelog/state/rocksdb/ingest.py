"""Whole key groups into an empty RocksDB store as SST files, not as write batches.

A restore's snapshot is most of its entries. Written through write batches, every entry
is inserted into a memtable, flushed to a level-0 file and compacted again in the
background (CPU a restore on two shared cores cannot spare, and reads of the changelog
tail then search many files). Written with RocksDB's ``SstFileWriter`` instead, each
entry is appended to a sorted file once, and ``ingest_external_file`` moves the file
into the store as it is.

Only into key ranges the store has nothing in (the caller checks): an ingested file's
entries are newer than everything already stored, so ingesting into a range with data
would hide it, not merge with it. RocksDB refuses keys out of order (the caller sorts).

Bounded: a file is ingested once it holds :data:`MAX_FILE_BYTES`, so a restore holds
at most that much disk beyond the store, and no more memory than the key group being
written.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: An SST file is ingested (and a new one started) once it holds this many bytes.
MAX_FILE_BYTES = 64 << 20

_files = itertools.count()


class SstIngest:
    """Writes sorted entries of key groups into SST files in ``directory`` and ingests
    each into ``db`` when it is full or at :meth:`finish`.

    Invariant: within a file, keys are strictly ascending (a key group below the last
    one written starts a new file; RocksDB raises on anything else out of order), and
    every file is ingested or deleted by :meth:`finish` / :meth:`abandon`.
    """

    def __init__(self, rocks: Any, db: Any, options: Any, directory: Path,
                 max_file_bytes: int | None = None) -> None:
        """``rocks``: the ``rocksdict`` module; ``options``: the store's options (their
        ``raw_mode``, compression and table format are the files'); ``max_file_bytes``:
        default :data:`MAX_FILE_BYTES`."""
        self._rocks, self._db, self._options = rocks, db, options
        self._directory = directory
        self._max_file_bytes = MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
        self._writer: Any = None
        self._path: Path | None = None
        self._last_group = -1
        self._empty = True  # the file being written: RocksDB refuses to finish an empty one
        #: SST files ingested so far.
        self.files_ingested = 0

    def add_group(self, key_group: int, keys: Sequence[bytes], values: Iterable[bytes]
                  ) -> None:
        """Write one key group's entries: ``keys`` strictly ascending, all starting with
        the key group's prefix, ``values`` theirs in the same order. A key group at or
        below the last one written goes to a new file."""
        if self._writer is not None and (key_group <= self._last_group
                                         or self._writer.file_size() >= self._max_file_bytes):
            self._ingest()
        if self._writer is None:
            self._open()
        self._last_group = key_group
        # A C-level loop: no bytecode, no tuple per entry.
        deque(map(self._writer.__setitem__, keys, values), maxlen=0)
        if keys:
            self._empty = False

    def finish(self) -> None:
        """Ingest the file being written (if any)."""
        if self._writer is not None:
            self._ingest()

    def abandon(self) -> None:
        """Drop the file being written (after an error): nothing more is ingested."""
        path, self._writer, self._path = self._path, None, None
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()

    def _open(self) -> None:
        self._path = self._directory / f"restore-{os.getpid()}-{next(_files)}.sst"
        writer = self._rocks.SstFileWriter(self._options)
        writer.open(str(self._path))
        self._writer = writer

    def _ingest(self) -> None:
        writer, path = self._writer, self._path
        self._writer, self._last_group = None, -1
        if self._empty:
            self._path = path
            self.abandon()
            return
        self._empty = True
        try:
            writer.finish()
            options = self._rocks.IngestExternalFileOptions()
            options.set_move_files(True)  # a hard link or rename: no copy of the data
            self._db.ingest_external_file([str(path)], options)
            self.files_ingested += 1
        finally:
            self._path = None
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()  # moved: only a leftover link goes


__all__ = ["MAX_FILE_BYTES", "SstIngest"]
