"""Finding the trace files under a path, and what a distprof run directory says about each.

A path is one file, a folder of Kineto traces from anywhere, or a run directory (local or fsspec URL).
Hidden files and folders, distprof's own JSON files and py-spy's outputs are not traces. In a run
directory each file carries its role, its rank and its manifest window. Nothing outside the folder given
is read: symlinks that leave it are reported, never followed; loops and dangling links are reported too.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import stat
from collections.abc import Callable
from typing import NamedTuple

from distprof.rundir.layout import MANIFEST, RUN_FILES, is_ray_timeline, is_url, rank_of_dir, stage_of_file
from distprof.rundir.manifest import MANIFEST_LIMIT, WindowRecord, read_manifest
from distprof.rundir.walk import walk
from distprof.trace.source import TraceError, file_kind, open_local
from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = ["TraceFile", "find_traces", "process_from_name", "rank_from_name"]


class TraceFile(NamedTuple):
    """A trace found under a path, with what its run directory says about it."""
    path: str
    manifest_rank: int | None = None
    role: str | None = None
    window: WindowRecord | None = None  # the manifest record of the window that wrote this file
    node: str | None = None  # the Ray node holding the file (listed there by distprof.analysis.rayfiles), else anywhere
    run_dir: str | None = None  # the distprof run directory holding it, relative to the path listed ("" for the path)


_RANK_PATTERNS = [re.compile(p) for p in (r"rank[-_]?(\d+)", r"worker[-_]?(\d+)")]


def rank_from_name(path: str) -> int | None:
    """``rank-3``, ``rank00003``, ``worker3`` (the last path component that names one wins)."""
    for part in reversed(path.replace("\\", "/").split("/")):
        low = part.lower()
        for pat in _RANK_PATTERNS:
            m = pat.search(low)
            if m:
                return int(m.group(1))
    return None


# torch.profiler.tensorboard_trace_handler's names: {worker_name}.{time}.pt.trace.json[.gz], the worker name being
# {hostname}_{pid} unless the job gave its own.
_HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d{10,}\.pt\.trace\.json(?:\.gz)?$")


def process_from_name(path: str) -> str | None:
    """The process that wrote a file, when its name says (``host_1234.1700000000000.pt.trace.json``, as
    ``tensorboard_trace_handler`` names them by default): ``"host:pid 1234"``; else None."""
    m = _HANDLER_NAME.match(path.replace("\\", "/").rsplit("/", 1)[-1])
    return f"{m.group('host')}:pid {int(m.group('pid'))}" if m else None


_TRACE_NAME = re.compile(r"\.json(\.gz)?$")


def _is_trace_name(n: str) -> bool:
    """A file worth reading: hidden files, distprof's own JSON files, py-spy's outputs and Ray timelines are not
    traces."""
    return not (n.startswith(".") or n in RUN_FILES or not _TRACE_NAME.search(n)
                or n.endswith((".speedscope.json", ".chrometrace.json")) or is_ray_timeline(n))


def _manifest_windows(data: bytes) -> dict[str, WindowRecord]:
    """File name -> the manifest record of the window that published it (torn or wrong-shaped lines are skipped;
    the files they named are still found on disk)."""
    out: dict[str, WindowRecord] = {}
    for rec in read_manifest(data).records:
        for entry in rec.files:
            out[entry.path.rsplit("/", 1)[-1]] = rec
    return out


def _run_dir(d: str, names: set[str]) -> int | None:
    """The rank of a distprof rank folder (``.../rank00003`` holding a manifest), else None."""
    return rank_of_dir(d) if MANIFEST in names else None


def _role(d: str, windows: dict[str, WindowRecord]) -> str:
    # The manifest names the role; a folder name is the fallback (the role folder itself may be `path`).
    return next((w.role for w in windows.values() if w.role), None) or \
        posixpath.basename(posixpath.dirname(d.rstrip("/")))


def _run_root(d: str, role: str, top: str) -> str:
    """The run directory holding rank folder ``d`` (``{root}/{role}/rank00003``), relative to ``top``: what tells
    files of two run directories under one folder apart (the same on every node for per-node copies of one)."""
    parts = d.replace("\\", "/").rstrip("/").split("/")[:-1]  # the rank folder's parent: the role's folder
    depth = len([x for x in role.split("/") if x])
    if 0 < depth <= len(parts) and parts[len(parts) - depth:] == [x for x in role.split("/") if x]:
        parts = parts[:len(parts) - depth]
    root = "/".join(parts)
    top = top.replace("\\", "/").rstrip("/")
    if root == top:
        return ""
    return root[len(top) + 1:] if root.startswith(top + "/") else root


def find_traces(path: str, problems: list[Problem] | None = None,
                timelines: list[str] | None = None) -> list[TraceFile]:
    """Trace files under ``path`` (a file, a folder of traces, or a distprof run directory; local or fsspec URL).

    Hidden files and folders, distprof's own JSON files and py-spy's outputs are skipped; in a run
    directory each file carries its role, its rank and its manifest window. What cannot be read as a
    trace is not returned but, when ``problems`` is given, appended to it as a
    :class:`~distprof.util.problem.Problem` at that path (``Problem.at(path, reason)``, whose line is
    ``path: reason``): a trace-named entry that is not a regular file (a FIFO would block a reader), a symlink that
    points outside ``path`` (never followed) or cannot be resolved (a loop, a dangling link), a folder that cannot
    be listed. Without ``problems`` they are logged. ``timelines``: the Ray task timelines the walk meets
    (regular local files, ``driver/rank*/*.ray_timeline.json.gz``) are appended to it (they are not traces).
    """
    def problem(p: str, message: str) -> None:
        if problems is not None:
            problems.append(Problem.at(p, message))
        else:
            logger.warning("%s: %s", p, message)

    if not is_url(path):
        return _find_local(path, problem, timelines)
    from distprof.rundir.netfs import describe, is_timeout, url_to_fs

    try:
        fs, root = url_to_fs(path, fresh=True)  # bounded waits: a store that never answers fails (netfs.py)
        # One call (isfile would swallow a store's error, then isdir wait as long again).
        kind = fs.info(root).get("type")
        is_file, is_dir = kind == "file", kind == "directory"
    except FileNotFoundError:
        is_file = is_dir = False
    except ImportError as e:  # e.g. s3:// without s3fs
        raise TraceError(f"{path}: cannot be read ({e})") from None
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: cannot be listed ({describe(e) if is_timeout(e) else e})") from None
    except Exception as e:  # a storage library's own errors (botocore's NoCredentialsError ...): the input's
        raise TraceError(f"{path}: cannot be listed ({describe(e)})") from None
    if is_file:
        return [TraceFile(path)]
    if not is_dir:
        raise TraceError(f"{path}: no such file or directory")
    found = []

    def unlisted(d: str, rel: str, e: Exception) -> None:
        problem(getattr(e, "filename", None) or path, f"cannot be listed ({describe(e) if is_timeout(e) else e})")

    for folder in walk(root, links="report", fs=fs, skip=_hidden, on_error=unlisted):
        d = folder.path
        names = [e.name for e in folder.entries if e.kind != "dir"]
        windows, manifest_rank, role, run_root = {}, _run_dir(d, set(names)), None, None
        if manifest_rank is not None:
            try:
                with fs.open(posixpath.join(d, MANIFEST), "rb") as f:
                    windows = _manifest_windows(f.read(MANIFEST_LIMIT))
            except OSError as e:
                problem(fs.unstrip_protocol(posixpath.join(d, MANIFEST)),
                        f"cannot be read ({describe(e) if is_timeout(e) else e})")
            role = _role(d, windows)
            run_root = _run_root(d, role, root)
        for n in names:
            if _is_trace_name(n):
                found.append(TraceFile(fs.unstrip_protocol(posixpath.join(d, n)), manifest_rank, _file_role(role, n),
                                       windows.get(n), run_dir=run_root))
    found.sort(key=lambda f: f.path)
    return found


def _file_role(role: str | None, name: str) -> str | None:
    """A discrete-mode stage file is analysed as a role of its own, ``actor:rollout-generate``: the ranks of one
    stage are compared with each other (and a stage's second run in a step, ``...-2``, with its second runs)."""
    stage = stage_of_file(name)
    return f"{role}:{stage}" if stage and role else role


def _find_local(path: str, problem: Callable[[str, str], None], timelines: list[str] | None = None) -> list[TraceFile]:
    """:func:`find_traces` on a local path: symlinks are followed only while they stay inside ``path``."""
    root = path.removeprefix("file://")
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file or directory") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
    if stat.S_ISREG(st.st_mode):
        return [TraceFile(path)]
    if not stat.S_ISDIR(st.st_mode):
        raise TraceError(f"{path}: not a regular file ({file_kind(st.st_mode)})")
    top = os.path.abspath(root)
    inside = os.path.realpath(top).rstrip("/") + "/"
    found: list[TraceFile] = []

    def unlisted(d: str, rel: str, e: Exception) -> None:
        problem(d, f"folder cannot be listed ({getattr(e, 'strerror', None) or e})")

    for folder in walk(top, links="report", skip=_hidden, on_error=unlisted):
        d = folder.path
        windows, manifest_rank, role, run_root = {}, _run_dir(d, set(folder.names)), None, None
        if manifest_rank is not None:
            windows = _read_manifest(os.path.join(d, MANIFEST), inside, problem)
            role = _role(d, windows)
            run_root = _run_root(d, role, top)
        for ent in folder.entries:
            p = ent.path
            if ent.kind == "outside":
                problem(p, f"symlink points outside {path}; not followed")
            elif ent.kind == "broken":
                problem(p, f"cannot be followed ({getattr(ent.error, 'strerror', None) or ent.error})")
            elif ent.kind == "dir":
                continue
            elif _is_trace_name(ent.name):
                if ent.kind != "file":
                    problem(p, f"not a regular file ({file_kind(ent.st.st_mode if ent.st else 0)}); not read")
                    continue
                found.append(TraceFile(p, manifest_rank, _file_role(role, ent.name), windows.get(ent.name),
                                       run_dir=run_root))
            elif timelines is not None and is_ray_timeline(ent.name) and ent.kind == "file":
                timelines.append(p)
    found.sort(key=lambda f: f.path)
    return found


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _read_manifest(p: str, inside: str, problem: Callable[[str, str], None]) -> dict[str, WindowRecord]:
    try:
        if not os.path.realpath(p).startswith(inside):
            problem(p, "symlink points outside the folder; not followed")
            return {}
        with open_local(p) as f:
            return _manifest_windows(f.read(MANIFEST_LIMIT))
    except (OSError, TraceError) as e:
        problem(p, f"cannot be read ({getattr(e, 'strerror', None) or e})")
        return {}
