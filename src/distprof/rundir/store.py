"""Writing a run directory: atomic publication, manifest lines, run.json; listing what a node holds.

Files only ever appear complete: they are written under a hidden temporary name (:func:`layout.temp_name`;
created exclusively, under a name nobody can predict, never through a link: :mod:`.safefile`) in the same
directory and published by a hard link (which, unlike a rename, never replaces another writer's file: see
:meth:`RunDir.publish`). A ``save_path`` that is an fsspec URL (``s3://``, ``gs://``,
``memory://``) is staged on local disk and uploaded object by object (an object store publishes an object
atomically). No step needs a collective: every writer owns its own files.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from distprof.rundir.layout import MANIFEST, RUN_JSON, TMP_PREFIX, conflict_name, is_url
from distprof.rundir.manifest import MANIFEST_LIMIT, WindowRecord, encode_record, read_manifest
from distprof.rundir.safefile import make_folder, place, write_bytes
from distprof.rundir.safefile import temp_path as safe_temp_path
from distprof.rundir.walk import walk

logger = logging.getLogger(__name__)

__all__ = ["Published", "RunDir", "append_line", "list_files", "manifest_records"]

_json = msgspec.json.Encoder()


# Room left under PATH_MAX for what the profiler adds below save_path (role/rank00000/.tmp-PID-step...-....pid....).
_NAMES_BELOW = 160


@dataclass(frozen=True)
class Published:
    path: str  # relative to save_path, POSIX separators
    bytes: int
    conflict: bool = False  # another writer held the name: published under conflict_name()


class RunDir:
    """One save_path, local or remote. Cheap to build; touches nothing until asked."""

    def __init__(self, save_path: str):
        self.save_path = save_path
        self.remote = is_url(save_path)
        if save_path.startswith("file://"):
            save_path = save_path[len("file://") :]
        self.root = save_path if self.remote else os.path.abspath(os.path.expanduser(save_path))
        self._fs = None
        self._staging: str | None = None
        self.store_failed: str | None = None  # why the last small-file write to the object store failed (upload.py)

    # ---- checks ---------------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Raise ValueError naming save_path when it certainly cannot be written."""
        if self.remote:
            import fsspec

            protocol = self.root.split("://", 1)[0]
            try:
                fsspec.get_filesystem_class(protocol)
            except (ImportError, ValueError) as e:
                raise ValueError(
                    f"save_path {self.save_path!r} needs fsspec support for {protocol!r} ({e}); "
                    "install it (pip install 'distprof[cloud]' for s3/gs) or use a local path"
                ) from None
            return
        self._check_length()
        p = Path(self.root)
        if p.exists() and not p.is_dir():
            raise ValueError(f"save_path {self.save_path!r} exists and is not a directory; choose a directory path")
        probe = p
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            raise ValueError(
                f"save_path {self.save_path!r} cannot be written ({probe} is not a writable directory); "
                "choose a directory this process may write to"
            )

    def _check_length(self) -> None:
        """A path the OS refuses by length is a config error (ValueError), not an OSError from deep inside."""
        raw = os.fsencode(self.root)
        name_max, path_max = 255, 4096
        try:
            name_max = os.pathconf("/", "PC_NAME_MAX")
            path_max = os.pathconf("/", "PC_PATH_MAX")
        except (OSError, ValueError):  # not every platform reports them: keep Linux's limits
            pass
        longest = max((len(c) for c in raw.split(b"/")), default=0)
        if longest > name_max:
            raise ValueError(f"save_path {_shown(self.save_path)} has a component of {longest} bytes, over this "
                             f"system's limit of {name_max}; use shorter folder names")
        if len(raw) + _NAMES_BELOW > path_max:
            raise ValueError(f"save_path {_shown(self.save_path)} is {len(raw)} bytes long; with the files written "
                             f"below it, paths would exceed this system's limit of {path_max}; use a shorter path")

    # ---- paths --------------------------------------------------------------------------------
    @property
    def fs(self):
        if self._fs is None:
            from distprof.rundir.netfs import url_to_fs

            self._fs, self.root = url_to_fs(self.save_path)  # bounded waits: a hung store fails, never hangs
        return self._fs

    def local_dir(self, rel_dir: str) -> str:
        """A local directory where files destined for ``rel_dir`` are written before publication."""
        if self.remote:
            if self._staging is None:
                self._staging = tempfile.mkdtemp(prefix="distprof-stage-")
            d = os.path.join(self._staging, rel_dir)
            os.makedirs(d, exist_ok=True)
            return d
        os.makedirs(self.root, exist_ok=True)
        return make_folder(self.root, rel_dir)  # a folder below save_path that is a link is refused (UnsafePath)

    def temp_path(self, rel_dir: str, name: str) -> str:
        """A hidden temporary path beside the final one, ending like it (torch gzips by suffix), created empty and
        exclusively under a name nobody can predict (:func:`safefile.temp_path`): a link planted in the rank folder
        is never written through, and a window staged for upload is still there while the next one is exported."""
        return safe_temp_path(self.local_dir(rel_dir), name)

    def url(self, rel: str) -> str:
        return posixpath.join(self.save_path.rstrip("/"), rel) if self.remote else os.path.join(self.root, rel)

    # ---- publication ---------------------------------------------------------------------------------
    def publish(self, tmp: str, rel_dir: str, name: str, unlink: bool = True) -> Published:
        """Make ``tmp`` appear, complete, as ``rel_dir/name``; never over another writer's file.

        Two processes that claim one (role, rank) write the same names: the second keeps its file under
        :func:`layout.conflict_name` (``Published.conflict``). Locally this is exact (a hard link fails if the
        name exists; a file system without hard links gets a check before a rename); on an object store it is a
        check before the put, so two puts racing within one round trip can still overwrite each other (object
        stores have no portable create-if-absent). ``unlink``: delete ``tmp`` once put (the upload thread does it
        itself, unless stop() has kept the window locally meanwhile).
        """
        size = os.path.getsize(tmp)
        if self.remote:
            fs = self.fs
            fs.makedirs(posixpath.join(self.root, rel_dir), exist_ok=True)
            conflict = fs.exists(posixpath.join(self.root, rel_dir, name))
            if conflict:
                name = conflict_name(name, os.getpid())
            rel = str(PurePosixPath(rel_dir) / name)
            fs.put_file(tmp, posixpath.join(self.root, rel))
            if unlink:
                os.unlink(tmp)
            return Published(path=rel, bytes=size, conflict=conflict)
        want, nth = name, 0
        while True:
            rel = str(PurePosixPath(rel_dir) / name)
            if _place(tmp, os.path.join(self.root, rel)):
                return Published(path=rel, bytes=size, conflict=nth > 0)
            nth += 1
            if nth > 1000:  # a thousand writers of one name: something else is wrong; say so
                raise FileExistsError(f"{rel}: a thousand files of this name already exist")
            name = conflict_name(want, os.getpid(), nth)

    def keep_local(self, tmp: str, rel_dir: str, name: str, keep_dir: str) -> Published:
        """Move a staged file that could not be uploaded to ``keep_dir`` (kept, never deleted)."""
        size = os.path.getsize(tmp)
        os.makedirs(keep_dir, exist_ok=True)
        final = os.path.join(keep_dir, name)
        want, nth = name, 0
        while os.path.exists(final):
            nth += 1
            name = conflict_name(want, os.getpid(), nth)
            final = os.path.join(keep_dir, name)
        shutil.move(tmp, final)
        return Published(path=str(PurePosixPath(rel_dir) / name), bytes=size)

    def unsent_dir(self, rel_dir: str) -> str:
        """Where this run's files that could not be uploaded are kept on this host:
        ``$XDG_CACHE_HOME/distprof/unsent/{save_path, flattened}/{rel_dir}`` (``~/.cache`` by default).
        Outside the staging folder, which is deleted at stop()."""
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        flat = re.sub(r"[^A-Za-z0-9._-]+", "_", self.save_path).strip("_")[:200] or "run"
        return os.path.join(cache, "distprof", "unsent", flat, *rel_dir.split("/"))

    def append_local_manifest(self, local_dir: str, record: WindowRecord) -> None:
        """One manifest line in a local folder (a window kept on this host when the object store was down)."""
        os.makedirs(local_dir, exist_ok=True)
        _append_line(os.path.join(local_dir, MANIFEST), encode_record(record))

    def append_manifest(self, rel_dir: str, record: WindowRecord) -> None:
        line = encode_record(record)
        if self.remote:
            # Object stores cannot append; each role/rank directory has one writer, so rewrite it whole.
            path = posixpath.join(self.root, rel_dir, MANIFEST)
            old = self.fs.cat_file(path) if self.fs.exists(path) else b""
            self.fs.pipe_file(path, old + line)
            return
        _append_line(os.path.join(self.local_dir(rel_dir), MANIFEST), line)

    def write_run_json(self, info: dict[str, Any], rel: str = RUN_JSON) -> bool | None:
        """Write run.json (or another small JSON file) unless another process already did (first writer wins).

        True if we wrote it. To an fsspec URL: the store calls, made where this is called (a Profiler goes through
        :func:`.publish.write_json`, which runs this on the upload thread: ``start()`` never waits on the network).
        """
        data = msgspec.json.format(_json.encode(info), indent=2) + b"\n"
        if self.remote:
            return self._put_if_absent(rel, data)
        os.makedirs(self.root, exist_ok=True)
        if os.path.lexists(os.path.join(self.root, rel)):
            return False
        return write_bytes(self.root, rel, data, exclusive=True)  # atomic first-writer-wins, never through a link

    def _put_if_absent(self, rel: str, data: bytes) -> bool:
        """On an object store: put ``rel`` unless it exists (a check before the put: best effort)."""
        path = posixpath.join(self.root, rel)
        fs = self.fs
        if fs.exists(path):
            return False
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, data)
        return True

    def cleanup(self) -> None:
        if self._staging:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None


_warned_conflict = False


def warn_conflict(run: RunDir, rel_dir: str, names: list[str], published: list[Published], who: str) -> None:
    """Warn once per process that another writer holds this (role, rank), naming it when its manifest says."""
    global _warned_conflict
    if _warned_conflict or not any(p.conflict for p in published):
        return
    _warned_conflict = True
    other = "another process"
    if not run.remote:
        try:
            with open(os.path.join(run.root, rel_dir, MANIFEST), "rb") as fh:
                records = read_manifest(fh.read(MANIFEST_LIMIT)).records
            wanted = {str(PurePosixPath(rel_dir) / n) for n in names}
            for r in records:
                if r.pid != os.getpid() and wanted & {f.path for f in r.files}:
                    other = f"process {r.pid} on {r.host}"
                    break
        except OSError:  # the other writer has not written its line yet: say what we know
            pass
    logger.warning("distprof: %s: %s already wrote %s under %s; this process keeps its file as %s. Two processes "
                   "claim the same role and rank (did rank detection fall back to 0?); both files are kept",
                   who, other, names[0] if names else "?", run.url(rel_dir), published[0].path)


def _place(tmp: str, final: str) -> bool:
    """Give ``tmp`` the name ``final`` unless that name exists (then False, ``tmp`` untouched): :func:`safefile.place`
    (a hard link, atomic and never replacing a file, unlike a rename; a check, then a rename, without hard links)."""
    return place(tmp, final)


def append_line(path: str, line: bytes) -> None:
    """Append ``line`` (one JSON line, newline included) to ``path`` as the manifest is appended: one ``write()`` on
    an ``O_APPEND`` descriptor opened without following a link (the watcher's detections.jsonl too)."""
    _append_line(path, line)


def _append_line(path: str, line: bytes) -> None:
    # One write() on an O_APPEND file: a reader never sees half a line, and writers sharing the file
    # (two processes of one rank) never overwrite each other's lines.
    # Never through a link planted at the manifest's name (O_NOFOLLOW).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _shown(path: str) -> str:
    """A save_path in a message: a 100,000-character one is cut, its length is said separately."""
    return repr(path) if len(path) <= 120 else repr(path[:100] + "...")


def list_files(root: str) -> list[dict[str, Any]]:
    """Finished files under a local ``root`` (hidden temporaries excluded), paths relative to it.

    Only regular files are listed, and symlinks are neither listed nor followed (the walk's ``links="skip"``): a
    link placed in a run directory must never bring a file from elsewhere along (``collect`` copies what this lists).
    """
    out = []
    for folder in walk(root, links="skip", skip=_temporary):
        for e in folder.entries:
            if e.kind == "file" and e.st is not None:
                out.append({"path": os.path.relpath(e.path, root), "bytes": e.st.st_size})
    return out


def _temporary(name: str) -> bool:
    return name.startswith(TMP_PREFIX)


def manifest_records(root: str) -> list[WindowRecord]:
    """Every well-formed manifest record under a local run directory, by path (torn lines skipped)."""
    out: list[WindowRecord] = []
    for f in list_files(root):
        if os.path.basename(f["path"]) == MANIFEST:
            with open(os.path.join(root, f["path"]), "rb") as fh:
                out += read_manifest(fh.read(MANIFEST_LIMIT)).records
    return out
