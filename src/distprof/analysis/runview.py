"""A read-only view of a run directory (a local path or an fsspec URL): the one way ``check`` reads one.

A run directory comes from another job and may hold anything: a symlink to ``/etc/passwd`` or ``/dev/zero``,
a FIFO named like a trace, a manifest naming ``../../etc/passwd``. The view lists folders and files, stats
sizes, reads small files with a bound and hands out the path a trace reader may open, and it never reads,
follows or names for reading anything outside its root: locally every path is resolved (``realpath``) and must
stay inside the root and be a regular file (FIFOs and devices are refused without opening them blocking);
a path taken from a manifest must first pass :func:`manifest.safe_relpath`. What was refused while walking
is kept in :attr:`RunView.refused` as ``(relative path, why)``.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator
from typing import Any

from distprof.rundir.layout import is_url
from distprof.rundir.walk import Entry as WalkEntry
from distprof.rundir.walk import walk

__all__ = ["RunView", "ViewError"]


class ViewError(ValueError):
    """A path of the run directory that cannot be read (the message names it and says why)."""


class RunView:
    """``path``: a local folder or an fsspec URL. Cheap to build; :meth:`root_kind` is the first I/O."""

    def __init__(self, path: str):
        self.path = path
        self.remote = is_url(path)
        self.refused: list[tuple[str, str]] = []
        if self.remote:
            self.where = path.rstrip("/") or path
            self._fs: Any = None  # the fsspec filesystem (fsspec is untyped here), set by root_kind
            self._root = ""
        else:
            self.where = os.path.abspath(os.path.expanduser(path.removeprefix("file://")))
            self._real = os.path.realpath(self.where)

    # ---- the root ---------------------------------------------------------------------------------------
    def root_kind(self) -> str:
        """``dir``, ``file``, ``missing`` or the kind of a non-regular local entry (``a FIFO`` ...).

        Raises :class:`ViewError` when the root cannot be looked at (no fsspec support, no permission, a storage
        error)."""
        if not self.remote:
            try:
                mode = os.stat(self.where).st_mode
            except FileNotFoundError:
                return "missing"
            except OSError as e:
                raise ViewError(f"{self.where}: cannot be read ({e.strerror or e})") from None
            if stat.S_ISDIR(mode):
                return "dir"
            return "file" if stat.S_ISREG(mode) else _kind(mode)
        from distprof.rundir.netfs import describe, url_to_fs

        try:
            self._fs, self._root = url_to_fs(self.path, fresh=True)  # bounded waits: a store that never answers fails
            # One call (isfile would swallow a store's error, then isdir wait as long again).
            kind = self._fs.info(self._root).get("type")
        except FileNotFoundError:
            return "missing"
        except ImportError as e:  # s3:// without s3fs
            raise ViewError(f"{self.where}: cannot be read ({e})") from None
        except Exception as e:  # a storage library's own errors (botocore's NoCredentialsError ...): the input's
            raise ViewError(f"{self.where}: cannot be read ({describe(e)})") from None
        return "file" if kind == "file" else "dir" if kind == "directory" else "missing"

    # ---- listing ----------------------------------------------------------------------------------------
    def walk(self) -> Iterator[tuple[str, list[str], list[str]]]:
        """``(folder, subfolders, files)`` top-down from the root, relative POSIX paths ("" is the root).

        Entries that are refused (a symlink leaving the root, a FIFO, a device, a loop) are neither listed nor
        followed; each is recorded in :attr:`refused`. A symlinked folder inside the root is walked once."""
        if self.remote:
            folders = walk(self._root, links="report", fs=self._fs, on_error=self._unlisted)
        else:
            folders = walk(self.where, links="report", on_error=self._unlisted)
        for folder in folders:
            dirs, files = [], []
            for e in folder.entries:
                if e.kind == "dir":
                    dirs.append(e.name)
                elif e.kind == "file":
                    files.append(e.name)
                elif (why := _refused(e)) is not None:
                    self.refused.append((e.rel, why))
            yield folder.rel, dirs, files

    def _unlisted(self, path: str, rel: str, e: Exception) -> None:
        if isinstance(e, FileNotFoundError):
            return
        if self.remote:
            self.refused.append((rel or ".", f"cannot be listed ({type(e).__name__}: {e})"))
        else:
            self.refused.append((rel or ".", f"folder cannot be listed ({getattr(e, 'strerror', None) or e})"))

    # ---- files ----------------------------------------------------------------------------------------
    def size(self, rel: str) -> int | None:
        """Bytes of regular file ``rel``; None when it does not exist. Raises :class:`ViewError` when it is not a
        regular file inside the root."""
        if self.remote:
            try:
                p = self._abs(rel)
                if not self._fs.isfile(p):
                    return None
                return int(self._fs.size(p))
            except FileNotFoundError:
                return None
            except Exception as e:
                raise ViewError(f"{rel}: cannot be read ({type(e).__name__}: {e})") from None
        try:
            if self._local_kind(rel) != "file":
                raise ViewError(f"{rel}: not a regular file (a directory)")
        except FileNotFoundError:
            return None
        return os.stat(self._local(rel)).st_size

    def read_small(self, rel: str, limit: int) -> bytes | None:
        """At most ``limit`` bytes of file ``rel`` (None when it does not exist); raises :class:`ViewError` when it
        cannot be read, is outside the root or is not a regular file (a FIFO is refused, never waited on)."""
        if self.remote:
            try:
                with self._fs.open(self._abs(rel), "rb") as f:
                    return f.read(limit)
            except FileNotFoundError:
                return None
            except IsADirectoryError:
                raise ViewError(f"{rel}: not a regular file (a directory)") from None
            except Exception as e:
                raise ViewError(f"{rel}: cannot be read ({type(e).__name__}: {e})") from None
        from distprof.trace.source import TraceError, open_local

        try:
            if self._local_kind(rel) != "file":
                raise ViewError(f"{rel}: not a regular file (a directory)")
            with open_local(self._local(rel)) as f:
                return f.read(limit)
        except FileNotFoundError:
            return None
        except TraceError as e:
            raise ViewError(f"{rel}: {_why(e)}") from None
        except OSError as e:
            raise ViewError(f"{rel}: cannot be read ({e.strerror or e})") from None

    def read_tail(self, rel: str, n: int) -> bytes:
        """The last ``n`` bytes of file ``rel`` (checked like :meth:`read_small`)."""
        size = self.size(rel) or 0
        if self.remote:
            try:
                with self._fs.open(self._abs(rel), "rb") as f:
                    f.seek(max(0, size - n))
                    return f.read(n)
            except Exception as e:
                raise ViewError(f"{rel}: cannot be read ({type(e).__name__}: {e})") from None
        from distprof.trace.source import open_local

        with open_local(self._local(rel)) as f:
            f.seek(max(0, size - n))
            return f.read(n)

    def stream_path(self, rel: str) -> str:
        """The path (local) or URL a streaming reader (``analysis.reader.open_trace``) may open for file ``rel``,
        once it is known to be a regular file inside the root. Raises :class:`ViewError` otherwise."""
        if self.remote:
            return self._fs.unstrip_protocol(self._abs(rel))
        if self._local_kind(rel) != "file":
            raise ViewError(f"{rel}: not a regular file (a directory)")
        return os.path.realpath(self._local(rel))  # resolved now: a link swapped later cannot lead outside

    def url(self, rel: str) -> str:
        """How to name ``rel`` to a user."""
        return posixpath.join(self.where, rel) if self.remote else os.path.join(self.where, rel)

    # ---- inside the root --------------------------------------------------------------------------------
    def _abs(self, rel: str) -> str:
        return posixpath.join(self._root, rel) if rel else self._root

    def _local(self, rel: str) -> str:
        return os.path.join(self.where, *rel.split("/")) if rel else self.where

    def _local_kind(self, rel: str) -> str:
        """``file`` or ``dir`` for an entry that resolves inside the root; ViewError for anything else (a symlink
        leaving the root or dangling, a FIFO, a device); FileNotFoundError when there is no such entry."""
        p = self._local(rel)
        real = os.path.realpath(p)
        if real != self._real and not real.startswith(self._real.rstrip("/") + "/"):
            if not os.path.lexists(p):
                raise FileNotFoundError(p)
            raise ViewError(f"{rel}: symlink points outside the run directory; not followed")
        try:
            mode = os.stat(real).st_mode
        except FileNotFoundError:
            if os.path.lexists(p):
                raise ViewError(f"{rel}: dangling symlink") from None
            raise
        except OSError as e:
            raise ViewError(f"{rel}: cannot be followed ({e.strerror or e})") from None
        if stat.S_ISDIR(mode):
            return "dir"
        if stat.S_ISREG(mode):
            return "file"
        raise ViewError(f"{rel}: not a regular file ({_kind(mode)}); not read")


def _refused(e: WalkEntry) -> str | None:
    """Why a walked entry is not read (None: it vanished since its folder was listed)."""
    if e.kind == "outside":
        return "symlink points outside the run directory; not followed"
    if e.kind == "broken":
        if isinstance(e.error, FileNotFoundError):
            return "dangling symlink" if e.link else None
        return f"cannot be followed ({getattr(e.error, 'strerror', None) or e.error})"
    return f"not a regular file ({_kind(e.st.st_mode if e.st else 0)}); not read"


def _kind(mode: int) -> str:
    from distprof.trace.source import file_kind

    return file_kind(mode)


def _why(e: Exception) -> str:
    """The reason part of a ``path: reason`` message."""
    text = str(e)
    return text.split(": ", 1)[1] if ": " in text else text
