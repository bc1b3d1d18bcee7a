"""The run directory: layout, atomic publication, manifest lines, run.json.

    {save_path}/run.json
    {save_path}/{role}/rank{R:05d}/step{A:08d}-{B:08d}{suffix}
    {save_path}/{role}/rank{R:05d}/step{A:08d}-{A:08d}.stage-{stage}{suffix}   (discrete mode: one per stage run)
    {save_path}/{role}/rank{R:05d}/manifest.jsonl

Files only ever appear complete: they are written under a hidden temporary
name in the same directory and renamed. A ``save_path`` that is an fsspec URL
(``s3://``, ``gs://``, ``memory://``) is staged on local disk and uploaded
object by object (an object store publishes an object atomically).
No step needs a collective: every writer owns its own files.
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

logger = logging.getLogger(__name__)

__all__ = ["RunDir", "rank_dir", "window_file_name", "stage_label", "stage_of_file", "sanitize_role", "is_url",
           "TMP_PREFIX", "MANIFEST", "RUN_JSON"]

TMP_PREFIX = ".tmp-"
MANIFEST = "manifest.jsonl"
RUN_JSON = "run.json"
ROLE_JSON = "role.json"  # {role}/role.json: that role's world size and plan, for `distprof check`

_json = msgspec.json.Encoder()


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def sanitize_role(role: str) -> str:
    """Normalise a role given in code; refuse one that would leave the run directory."""
    if not isinstance(role, str) or not role.strip():
        raise ValueError(f"role must be a non-empty string, got {role!r}")
    parts = [p for p in role.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or role.startswith(("/", "~")) or ".." in parts:
        raise ValueError(f"role {role!r} would write outside save_path; use a relative name such as 'actor/micro_step'")
    return "/".join(parts)


def rank_dir(role: str, rank: int) -> str:
    return f"{role}/rank{rank:05d}"


def window_file_name(start: int, end: int, suffix: str, label: str | None = None) -> str:
    """``step00000003-00000005.pt.trace.json.gz``; with a discrete stage's ``label`` (see :func:`stage_label`),
    ``step00000003-00000003.stage-rollout-generate.pt.trace.json.gz``."""
    return f"step{start:08d}-{end:08d}{'.' + label if label else ''}{suffix}"


_STAGE_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_STAGE_FILE = re.compile(r"^step\d{8}-\d{8}\.stage-([A-Za-z0-9_-]+)\.")


def stage_label(stage: str, nth: int = 1) -> str:
    """A stage name as a file-name part: ``rollout/generate`` -> ``rollout-generate``; the stage's ``nth`` run
    in one step (from 2) gets ``-2``, ``-3`` ... so every run keeps its own file."""
    slug = _STAGE_UNSAFE.sub("-", stage).strip("-")[:80] or "unnamed"
    return f"stage-{slug}" if nth == 1 else f"stage-{slug}-{nth}"


def stage_of_file(name: str) -> str | None:
    """The stage label in a discrete-mode file name (None for a window file)."""
    m = _STAGE_FILE.match(posixpath.basename(name))
    return m.group(1) if m else None


@dataclass(frozen=True)
class Published:
    path: str  # relative to save_path, POSIX separators
    bytes: int


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

    # ---- paths --------------------------------------------------------------------------------
    @property
    def fs(self):
        if self._fs is None:
            import fsspec

            self._fs, self.root = fsspec.core.url_to_fs(self.save_path)
        return self._fs

    def local_dir(self, rel_dir: str) -> str:
        """A local directory where files destined for ``rel_dir`` are written before publication."""
        if self.remote:
            if self._staging is None:
                self._staging = tempfile.mkdtemp(prefix="distprof-stage-")
            d = os.path.join(self._staging, rel_dir)
        else:
            d = os.path.join(self.root, rel_dir)
        os.makedirs(d, exist_ok=True)
        return d

    def temp_path(self, rel_dir: str, name: str) -> str:
        """A hidden temporary path beside the final one, ending like it (torch gzips by suffix)."""
        return os.path.join(self.local_dir(rel_dir), f"{TMP_PREFIX}{os.getpid()}-{name}")

    def url(self, rel: str) -> str:
        return posixpath.join(self.save_path.rstrip("/"), rel) if self.remote else os.path.join(self.root, rel)

    # ---- publication ---------------------------------------------------------------------------------
    def publish(self, tmp: str, rel_dir: str, name: str) -> Published:
        """Make ``tmp`` appear, complete, as ``rel_dir/name``."""
        size = os.path.getsize(tmp)
        rel = str(PurePosixPath(rel_dir) / name)
        if self.remote:
            fs = self.fs
            fs.makedirs(posixpath.join(self.root, rel_dir), exist_ok=True)
            fs.put_file(tmp, posixpath.join(self.root, rel))
            os.unlink(tmp)
        else:
            os.replace(tmp, os.path.join(self.root, rel))
        return Published(path=rel, bytes=size)

    def append_manifest(self, rel_dir: str, record: dict[str, Any]) -> None:
        line = _json.encode(record) + b"\n"
        if self.remote:
            # Object stores cannot append; each role/rank directory has one writer, so rewrite it whole.
            path = posixpath.join(self.root, rel_dir, MANIFEST)
            old = self.fs.cat_file(path) if self.fs.exists(path) else b""
            self.fs.pipe_file(path, old + line)
            return
        # One write() on an O_APPEND file: a reader never sees half a line.
        fd = os.open(os.path.join(self.local_dir(rel_dir), MANIFEST), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def write_run_json(self, info: dict[str, Any], rel: str = RUN_JSON) -> bool:
        """Write run.json (or another small JSON file) unless another process already did (first writer wins).

        True if we wrote it.
        """
        data = msgspec.json.format(_json.encode(info), indent=2) + b"\n"
        if self.remote:
            path = posixpath.join(self.root, rel)
            fs = self.fs
            if fs.exists(path):
                return False
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            fs.pipe_file(path, data)
            return True
        final = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if os.path.exists(final):
            return False
        tmp = os.path.join(os.path.dirname(final), f"{TMP_PREFIX}{os.getpid()}-{os.path.basename(final)}")
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, final)  # fails if it exists: atomic first-writer-wins
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def cleanup(self) -> None:
        if self._staging:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
