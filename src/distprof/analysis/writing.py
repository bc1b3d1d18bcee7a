"""Writing an analysis's output file (``merge``'s trace, ``report``'s page): never over what must not be
written, never a torn file.

:func:`check_output` runs before anything is read, so a bad ``-o`` costs nothing and touches nothing: as
root, a rename onto the output replaced a read-only input trace and ``/dev/full`` before this check existed.
:func:`atomic_output` writes to a hidden temporary file beside the output, created exclusively (never through a
link planted at its name), and renames it when complete.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from distprof.rundir.layout import is_url
from distprof.rundir.safefile import AtomicWriter, UnsafePath
from distprof.trace.source import TraceError, file_kind

__all__ = ["atomic_output", "check_output"]


def check_output(out: str, inputs: Iterable[str], verb: str, example: str) -> None:
    """Refuse, in one line (TraceError), an output that cannot or must not be written: an empty name, a URL,
    a directory, a FIFO or device, one of the ``inputs``, a folder that does not exist or is not writable."""
    if not out:
        raise TraceError(f"{verb}: the output (-o) is empty; give a file name such as {example}")
    if is_url(out):
        raise TraceError(f"{out}: {verb} writes a local file; give a local path and copy it after")
    if os.path.isdir(out):
        raise TraceError(f"{out}: is a directory; give a file name such as {example}")
    if os.path.lexists(out):
        try:
            mode = os.stat(out).st_mode
        except OSError as e:
            raise TraceError(f"{out}: cannot write ({e.strerror or e})") from None
        if not stat.S_ISREG(mode):
            raise TraceError(f"{out}: not a regular file ({file_kind(mode)}); give a new file name")
        real = os.path.realpath(out)
        if any(not is_url(p) and os.path.realpath(p.removeprefix("file://")) == real for p in inputs):
            raise TraceError(f"{out}: is one of the traces being read; give another file name")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise TraceError(f"{out}: cannot write: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise TraceError(f"{out}: cannot write: folder {parent} is not writable")


@contextlib.contextmanager
def atomic_output(out: str) -> Iterator[BinaryIO]:
    """A file to write ``out``'s contents to: a hidden temporary beside ``out``, created exclusively under a name
    nobody can predict (:class:`~distprof.rundir.safefile.AtomicWriter`: a link planted there is never written
    through), renamed over ``out`` when the block ends without an error, removed otherwise. A write the file
    system refuses (full disk, read-only) is a TraceError."""
    try:
        with AtomicWriter(os.path.dirname(os.path.abspath(out)), os.path.basename(out)) as f:
            yield f
    except (OSError, UnsafePath) as e:
        raise TraceError(f"{out}: cannot write ({getattr(e, 'strerror', None) or e}); nothing was written") from None
