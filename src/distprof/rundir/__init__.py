"""The run directory: the one place its layout, its manifest and its storage are defined.

Every writer (the profiler, the process wrapper) and every reader (``check``, ``collect``, the analysis's
``find_traces``, the demo) goes through this package:

- :mod:`.layout`: names and layout rules (pure; no I/O);
- :mod:`.manifest`: the typed manifest record and its tolerant reader;
- :mod:`.safefile`: the one writer of every file created where others may write too (exclusive temporaries,
  no link followed below the root);
- :mod:`.store`: writing (atomic publication, never overwriting another writer; local or fsspec URL) and
  listing a node's files;
- :mod:`.upload`: the background uploader of windows bound for an fsspec URL (retries; keeps what fails);
- :mod:`.netfs`: every fsspec filesystem distprof opens, with bounded waits (a hung store fails, never hangs);

Reading a run directory whole (``check``, with its ``RunView``) is the analysis side's: :mod:`distprof.analysis.check`.
"""

from distprof.rundir.layout import (
    MANIFEST,
    PROCESS_BACKENDS,
    ROLE_JSON,
    RUN_JSON,
    TMP_PREFIX,
    is_url,
    rank_dir,
    rank_of_dir,
    sanitize_role,
    stage_label,
    stage_of_file,
    window_file_name,
)
from distprof.rundir.manifest import FileEntry, WindowRecord, read_manifest
from distprof.rundir.store import Published, RunDir, list_files

__all__ = [
    "MANIFEST",
    "PROCESS_BACKENDS",
    "ROLE_JSON",
    "RUN_JSON",
    "TMP_PREFIX",
    "FileEntry",
    "Published",
    "RunDir",
    "WindowRecord",
    "is_url",
    "list_files",
    "rank_dir",
    "rank_of_dir",
    "read_manifest",
    "sanitize_role",
    "stage_label",
    "stage_of_file",
    "window_file_name",
]

