"""Writing files where others may write too (a shared scratch file system): the one writer every distprof file
creation goes through.

- A temporary is created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``) under a name nobody can predict,
  :func:`layout.temp_name` of ``{random}-{name}`` (so ``.tmp-{pid}-`` still marks a write in progress), in the
  destination's own folder, then renamed onto the destination (:class:`AtomicWriter`), or hard-linked onto it
  when the first writer must win (``exclusive=True``). A symbolic link planted at a temporary's name can neither
  be guessed in advance nor be opened through.
- Every folder between the root a destination must stay in (a ``save_path``, ``collect``'s ``dest``, the folder of
  ``merge -o``) and the destination is opened one component at a time with ``O_NOFOLLOW | O_DIRECTORY`` relative to
  the one before (:func:`open_folder`), and ``..`` is refused, so nothing is written outside the root: a folder on
  the way that is a symbolic link is :class:`UnsafePath` (a ``ValueError``), one line naming it. The root itself
  is the caller's choice and may be a link. A rename onto a destination that is a link replaces the link.
- :func:`temp_path` hands a fresh, unpredictable temporary name (created empty, exclusively) to a writer that
  must open it itself (torch's trace export); :func:`place` (first writer wins) or :func:`replace` gives such a
  file its final name.

Standard library only; imports :mod:`.layout` for the temporary's name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from typing import BinaryIO

from distprof.rundir.layout import temp_name

__all__ = [
    "AtomicWriter",
    "UnsafePath",
    "make_folder",
    "no_links",
    "open_folder",
    "place",
    "replace",
    "temp_path",
    "touch",
    "write_bytes",
]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# A file system without hard links (some FUSE mounts of object stores, SMB): a check, then a rename.
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}
_TAIL = 120  # the end of the destination's name a temporary keeps (torch gzips by suffix)


class UnsafePath(ValueError):
    """A destination distprof will not write: it would leave the folder it must stay in (a symbolic link on the
    way, or ``..``)."""


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or ".." in parts:
        raise UnsafePath(f"{rel}: would leave the folder it must be written in; distprof does not write there")
    return parts


def _refuse_link(where: str, root: str) -> UnsafePath:
    return UnsafePath(f"{where} is a symbolic link; distprof does not write through it (it could point outside "
                      f"{root}): remove it")


def open_folder(root: str, rel: str = "", create: bool = True) -> int:
    """A directory descriptor for ``root/rel`` (the caller closes it), each folder below ``root`` created when
    missing (``create``) and opened without following a link: UnsafePath when one is a symbolic link."""
    fd = os.open(root, _DIR)
    where = root
    try:
        for part in _parts(rel):
            where = os.path.join(where, part)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "no such folder", where) from None
            if stat.S_ISLNK(st.st_mode):
                raise _refuse_link(where, root)
            try:
                nfd = os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:  # replaced by a link since the stat above
                if e.errno == errno.ELOOP:
                    raise _refuse_link(where, root) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_folder(root: str, rel: str = "") -> str:
    """``root/rel`` created as :func:`open_folder` creates it (never through a link); its path."""
    os.close(open_folder(root, rel))
    return os.path.join(root, *_parts(rel))


def no_links(root: str, rel: str) -> bool:
    """True when no component of ``rel`` below ``root`` is a symbolic link (missing ones are not), nor ``..``."""
    try:
        parts = _parts(rel)
    except UnsafePath:
        return False
    where = root
    for part in parts:
        where = os.path.join(where, part)
        if os.path.islink(where):
            return False
    return True


def _new_temp(dfd: int, name: str) -> tuple[str, int]:
    """Create a fresh temporary for ``name`` in the folder ``dfd``: (its name, a write descriptor)."""
    for _ in range(64):
        tmp = temp_name(os.getpid(), f"{secrets.token_hex(8)}-{name[-_TAIL:]}")
        try:
            return tmp, os.open(tmp, _NEW, 0o666, dir_fd=dfd)
        except FileExistsError:  # someone planted this very name: draw another
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def touch(path: str) -> None:
    """Make sure the empty marker ``path`` exists (it may already: two processes touch it), never through a link:
    a link planted at its name is removed (the name is ours) and the marker created in its place."""
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
            return
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    raise UnsafePath(f"{path}: a symbolic link keeps reappearing at this name; distprof does not write through it")


def temp_path(folder: str, name: str) -> str:
    """A fresh temporary path in ``folder`` (already checked, e.g. by :func:`make_folder`) for a file that will be
    called ``name``, created empty and exclusively: for a writer that opens the path itself (torch's export)."""
    dfd = os.open(folder, _DIR)
    try:
        tmp, fd = _new_temp(dfd, name)
        os.close(fd)
    finally:
        os.close(dfd)
    return os.path.join(folder, tmp)


def _link_first(dfd: int, src: str, dst: str) -> bool:
    """Give ``src`` the name ``dst`` in the folder ``dfd`` unless ``dst`` exists (False, ``src`` kept). A hard link
    is atomic and never replaces a file; without hard links, a check, then a rename."""
    try:
        os.link(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        try:
            os.stat(dst, dir_fd=dfd, follow_symlinks=False)
            return False
        except FileNotFoundError:
            os.replace(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd)
            return True
    os.unlink(src, dir_fd=dfd)
    return True


def place(tmp: str, final: str) -> bool:
    """First writer wins: give the file ``tmp`` the name ``final`` in the same folder unless ``final`` exists
    (then False, ``tmp`` untouched); never follows a link at either name."""
    folder = os.path.dirname(final)
    if os.path.dirname(tmp) != folder:
        raise UnsafePath(f"{tmp}: a temporary must sit in its destination's folder {folder}")
    dfd = os.open(folder or ".", _DIR)
    try:
        return _link_first(dfd, os.path.basename(tmp), os.path.basename(final))
    finally:
        os.close(dfd)


def replace(tmp: str, final: str) -> None:
    """Give the file ``tmp`` the name ``final`` in the same folder, replacing whatever is there (a link at ``final``
    is replaced, never followed): the rename of a temporary written by someone else (a tool's hidden output, a
    snapshot written by torch). ``FileNotFoundError`` when ``tmp`` is gone (renamed already)."""
    folder = os.path.dirname(final)
    if os.path.dirname(tmp) != folder:
        raise UnsafePath(f"{tmp}: a temporary must sit in its destination's folder {folder}")
    dfd = os.open(folder or ".", _DIR)
    try:
        os.replace(os.path.basename(tmp), os.path.basename(final), src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


class AtomicWriter:
    """``with AtomicWriter(root, rel) as f: f.write(...)``: ``root/rel`` appears whole when the block ends without
    an error, and nothing is left otherwise. ``exclusive``: only if ``rel`` does not exist yet (first writer wins;
    ``placed`` says whether this one did). ``fsync``: flushed to disk before the rename."""

    def __init__(self, root: str, rel: str, exclusive: bool = False, fsync: bool = False):
        parts = _parts(rel)
        if not parts:
            raise UnsafePath(f"{rel!r}: not a file name under {root}")
        self.root, self.folder, self.name = root, "/".join(parts[:-1]), parts[-1]
        self.path = os.path.join(root, *parts)
        self.exclusive, self.fsync = exclusive, fsync
        self.placed = False
        self._dfd: int | None = None
        self._tmp: str | None = None
        self.file: BinaryIO | None = None

    def __enter__(self) -> BinaryIO:
        self._dfd = open_folder(self.root, self.folder)
        try:
            self._tmp, fd = _new_temp(self._dfd, self.name)
        except BaseException:
            os.close(self._dfd)
            raise
        self.file = os.fdopen(fd, "wb")
        return self.file

    def __exit__(self, exc_type, exc, tb) -> None:
        dfd, f, tmp = self._dfd, self.file, self._tmp
        if dfd is None or f is None or tmp is None:
            raise RuntimeError("_FileWriter.__exit__ without a successful __enter__")
        try:
            if exc_type is None:
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())  # a full disk may only say so at write-back: find out before renaming
                f.close()
                if self.exclusive:
                    self.placed = _link_first(dfd, tmp, self.name)
                else:
                    os.replace(tmp, self.name, src_dir_fd=dfd, dst_dir_fd=dfd)  # never follows a link
                    self.placed = True
        finally:
            if not f.closed:
                f.close()
            if not (self.placed and not self.exclusive):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dfd)
            os.close(dfd)


def write_bytes(root: str, rel: str, data: bytes, exclusive: bool = False, fsync: bool = False) -> bool:
    """Write ``root/rel`` whole with :class:`AtomicWriter`; True if written (``exclusive``: False when it existed)."""
    w = AtomicWriter(root, rel, exclusive=exclusive, fsync=fsync)
    with w as f:
        f.write(data)
    return w.placed
