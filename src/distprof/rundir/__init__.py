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
- :mod:`.trigger`: on-demand capture requests and their acknowledgements (``distprof trigger``);
- :mod:`.view`: reading one (local or fsspec URL) without reading or following anything outside it;
- :mod:`.check`: is a run directory complete and readable.
"""

from .layout import (MANIFEST, PROCESS_BACKENDS, ROLE_JSON, RUN_JSON, TMP_PREFIX, is_url, rank_dir, rank_of_dir,
                     sanitize_role, stage_label, stage_of_file, window_file_name)
from .manifest import FileEntry, WindowRecord, read_manifest
from .store import Published, RunDir, list_files

__all__ = ["MANIFEST", "PROCESS_BACKENDS", "ROLE_JSON", "RUN_JSON", "TMP_PREFIX", "is_url", "rank_dir", "rank_of_dir",
           "sanitize_role", "stage_label", "stage_of_file", "window_file_name", "FileEntry", "WindowRecord",
           "read_manifest", "Published", "RunDir", "list_files", "check_run"]


def check_run(run_dir: str):
    """See :func:`distprof.rundir.check.check_run` (imported lazily: it needs the config module)."""
    from .check import check_run as _check_run

    return _check_run(run_dir)
