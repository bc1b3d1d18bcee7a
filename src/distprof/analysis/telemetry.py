"""Reading the ranks' step telemetry (``telemetry: true``; the writer and the format: distprof.capture.telemetry).

One :class:`StreamReader` per rank follows that rank's stream incrementally (the watcher reads only what was
appended since its last look, the verbs read it once); :func:`read_run` reads every rank of a run directory into
one :class:`RankSeries` per (role, rank). The streams are untrusted input like any trace:

- a line that is torn (a kill -9 mid-write), too long (over ``MAX_LINE``), not JSON, not UTF-8, nested too deep,
  of the wrong shape or with a number out of range is skipped and counted (``skipped``); every other line is read;
- a file is read at most ``MAX_READ`` bytes from its end, ``CHUNK`` bytes at a time (memory stays bounded by what
  is kept, whatever the bytes);
- symbolic links are never followed: not as the stream, nor as the rank folder (the one walker, ``links="skip"``;
  then the folder is opened without following a link and the stream opened inside it), and a stream that is not a
  regular file (a FIFO, a device) is never read;
- a stream that cannot be read, or a folder that cannot be listed, is one :class:`~distprof.util.problem.Problem`
  (once, however often :meth:`TelemetryRun.refresh` meets it); these are the only errors: no exception leaves
  :func:`read_run` or :meth:`TelemetryRun.refresh` for any content of the directory.

A rotation (the writer renamed the stream to ``telemetry.1.jsonl`` and began a new one) is followed: the rest of
the old segment is read before the new one. A file that shrank is read again from its start. A restarted rank (a
new header, steps repeated from its checkpoint) keeps the latest line of each step.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from distprof.rundir.layout import TELEMETRY, TELEMETRY_OLD, rank_of_dir
from distprof.rundir.walk import walk
from distprof.util.problem import Problem

__all__ = ["CHUNK", "MAX_LINE", "MAX_READ", "RankSeries", "StepRecord", "StreamReader", "TelemetryRun", "read_run"]

MAX_LINE = 64 * 1024  # a step line is ~100 bytes; one longer than this is not ours
MAX_READ = 256 * 1024 * 1024  # bytes read from one file at most (its newest part); streams rotate far below this
CHUNK = 256 * 1024  # bytes read and split into lines at a time
HEAD = 512  # bytes that tell one segment from another (its header, with the time it began, and more)
MAX_SEEN = 16  # hosts and pids kept per rank (a restarted rank adds one each)
_BIG = 2**53  # numbers beyond this are not a step, a time or a duration (and would not survive a JSON reader)

_Step = Annotated[int, msgspec.Meta(ge=-_BIG, le=_BIG)]
_Micros = Annotated[int, msgspec.Meta(ge=0, le=_BIG)]


class StepRecord(msgspec.Struct, frozen=True):
    """One step of one rank: its number, when it ended (unix s), its wall time and its phases (µs)."""

    step: _Step
    t: float
    dur_us: _Micros
    phases: dict[str, _Micros] = {}


class _Header(msgspec.Struct):
    telemetry: int
    role: str
    rank: int
    world_size: int = 0
    pid: int = 0
    host: str = ""


_STEP = msgspec.json.Decoder(StepRecord)
_HEADER = msgspec.json.Decoder(_Header)
# What decoding a hostile line may raise: malformed or wrong shape (DecodeError, ValidationError is one), bytes
# that are not UTF-8 inside a string (UnicodeDecodeError, a ValueError), nesting deeper than the C stack allows.
_BAD_LINE = (msgspec.DecodeError, ValueError, RecursionError)


@dataclass
class RankSeries:
    """One (role, rank)'s steps in step order (a restarted rank's repeated steps: the latest kept)."""

    role: str
    rank: int
    world_size: int = 0
    hosts: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    skipped: int = 0  # lines that could not be read

    def add(self, records: list[StepRecord]) -> None:
        if not records:
            return
        last = self.steps[-1].step if self.steps else None
        ordered = all(a.step < b.step for a, b in itertools.pairwise(records))
        if ordered and (last is None or records[0].step > last):
            self.steps.extend(records)
            return
        # A restart (steps repeated from a checkpoint), or an older segment read late: the latest line per step.
        by_step = {r.step: r for r in self.steps}
        by_step.update((r.step, r) for r in records)
        self.steps = [by_step[s] for s in sorted(by_step)]


class StreamReader:
    """Follows one rank's stream (``telemetry.jsonl``), and its rotated segment on the first read.

    :meth:`read` returns the step lines appended since the last call. A segment is known by its inode and its first
    ``HEAD`` bytes (its header holds the time it began: a new file that got a freed inode number back is still
    another segment). A rotation (another segment in place of the one read) finishes the old segment from
    ``telemetry.1.jsonl`` when it is still there, then reads the new one from its beginning; a segment that shrank
    is read again from its beginning."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path = os.path.join(folder, TELEMETRY)
        self.old_path = os.path.join(folder, TELEMETRY_OLD)
        self.header: _Header | None = None
        self.skipped = 0
        self.old_error: str | None = None  # why the older segment could not be read (it is then left out)
        self._seg: tuple[int, bytes] | None = None  # the segment being followed: (inode, its first bytes)
        self._pos = 0
        self._partial = b""
        self._discard = False  # inside a line too long to keep: drop bytes up to its end
        self._started = False

    def read(self) -> list[StepRecord]:
        """New step lines (OSError when the stream cannot be read at all)."""
        out: list[StepRecord] = []
        dfd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
        try:
            if not self._started:
                self._started = True
                self._old(dfd, 0, None, out)
            try:
                fd = _open(dfd, TELEMETRY, self.path)
            except FileNotFoundError:  # between the writer's rename and its new file: the old segment's rest
                if self._seg is not None:
                    self._pos = self._old(dfd, self._pos, self._seg, out)
                return out
            try:
                seg, size = _segment(fd)
                if self._seg is not None and (not _same(seg, self._seg) or size < self._pos):
                    if not _same(seg, self._seg):  # rotated: finish the old segment first
                        self._old(dfd, self._pos, self._seg, out)
                    self._pos, self._partial, self._discard = 0, b"", False
                self._seg = seg
                self._pos = self._read(fd, size, self._pos, out)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        return out

    def _old(self, dfd: int, pos: int, seg: tuple[int, bytes] | None, out: list[StepRecord]) -> int:
        """The older segment from ``pos`` to its end (only when it is the segment ``seg``, when given); where it
        ended. It cannot be read: ``old_error``, and it is left out."""
        try:
            fd = _open(dfd, TELEMETRY_OLD, self.old_path)
            try:
                now, size = _segment(fd)
                if seg is None or _same(now, seg):  # else rotated twice since the last read: that rest is gone
                    pos = self._read(fd, size, pos, out)
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.old_error = str(e)
        if self._partial and not self._discard:
            self._line(self._partial, out)  # a segment's last line: complete or torn, it is judged now
        self._partial, self._discard = b"", False
        return pos

    def _read(self, fd: int, end: int, pos: int, out: list[StepRecord]) -> int:
        """The lines of ``fd`` from ``pos`` to ``end`` (what it held when looked at: later lines wait for the
        next read), at most MAX_READ bytes (the newest), CHUNK at a time, into ``out``; where it stopped."""
        at = max(pos, end - MAX_READ)
        if at > pos:  # the oldest part is left unread: the line cut in two goes too
            self._partial, self._discard = b"", True
        os.lseek(fd, at, os.SEEK_SET)
        while at < end:
            b = os.read(fd, min(end - at, CHUNK))
            if not b:
                break
            at += len(b)
            self._split(b, out)
        return at

    def _split(self, data: bytes, out: list[StepRecord]) -> None:
        start = 0
        if self._discard:
            nl = data.find(b"\n")
            if nl < 0:
                return
            self._discard, start = False, nl + 1
        lines = data[start:].split(b"\n")
        rest = lines.pop()  # an unfinished last line waits for the rest
        if lines:
            lines[0] = self._partial + lines[0]
            self._partial = rest
        else:
            self._partial += rest
        for line in lines:
            self._line(line, out)
        if len(self._partial) > MAX_LINE:
            self._partial, self._discard, self.skipped = b"", True, self.skipped + 1

    def _line(self, line: bytes, out: list[StepRecord]) -> None:
        if len(line) > MAX_LINE:
            self.skipped += 1
            return
        first = line.lstrip()[:1]
        if not first:
            return
        if first == b"{":  # (what cannot be an object is not decoded at all: garbage costs little)
            try:
                out.append(_STEP.decode(line))
                return
            except _BAD_LINE:
                pass
            if b'"telemetry"' in line:
                try:
                    self.header = _HEADER.decode(line)
                    return
                except _BAD_LINE:
                    pass
        self.skipped += 1


def _open(dfd: int, name: str, path: str) -> int:
    """A read descriptor of ``name`` in the folder ``dfd``: never through a link (O_NOFOLLOW), never blocking on
    a FIFO (O_NONBLOCK), a regular file only."""
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), dir_fd=dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def _segment(fd: int) -> tuple[tuple[int, bytes], int]:
    """The segment ``fd`` is ((inode, its first HEAD bytes)) and its size."""
    st = os.fstat(fd)
    return (st.st_ino, os.pread(fd, HEAD, 0)), st.st_size


def _same(a: tuple[int, bytes], b: tuple[int, bytes]) -> bool:
    """One segment: the same inode, and the first bytes of one begin the other's (a segment still being written
    had fewer of them at the earlier look)."""
    n = min(len(a[1]), len(b[1]))
    return a[0] == b[0] and a[1][:n] == b[1][:n]


@dataclass
class TelemetryRun:
    """Every rank's telemetry in a run directory."""

    series: dict[tuple[str, int], RankSeries] = field(default_factory=dict)
    errors: list[Problem] = field(default_factory=list)
    readers: dict[tuple[str, int], StreamReader] = field(default_factory=dict)

    def roles(self) -> list[str]:
        return sorted({role for role, _ in self.series})

    def problem(self, path: str, message: str) -> None:
        """Record a problem once (a watcher refreshes the same unreadable stream again and again)."""
        if not any(p.path == path for p in self.errors):
            self.errors.append(Problem.at(path, message))

    def refresh(self, root: str) -> int:
        """Read what every stream appended since the last refresh (new ranks found too); the steps added."""
        added = 0
        for (role, rank), folder in _streams(root, self.problem):
            key = (role, rank)
            reader = self.readers.get(key)
            if reader is None:
                reader = self.readers[key] = StreamReader(folder)
            try:
                records = reader.read()
            except OSError as e:
                self.problem(reader.path, str(e))
                continue
            finally:
                if reader.old_error:
                    self.problem(reader.old_path, reader.old_error)
            s = self.series.get(key)
            if s is None:
                s = self.series[key] = RankSeries(role, rank)
            h = reader.header
            if h is not None:
                s.world_size = h.world_size or s.world_size
                if h.host and h.host not in s.hosts and len(s.hosts) < MAX_SEEN:
                    s.hosts.append(h.host)
                if h.pid and h.pid not in s.pids and len(s.pids) < MAX_SEEN:
                    s.pids.append(h.pid)
            s.add(records)
            s.skipped = reader.skipped
            added += len(records)
        return added


def _streams(root: str, problem: Callable[[str, str], None]) -> list[tuple[tuple[str, int], str]]:
    """((role, rank), folder) of every rank folder under ``root`` that holds a telemetry stream; a stream's name
    held by something else (a link, a FIFO) is a problem, never read."""
    out = []

    def on_error(path: str, rel: str, e: Exception) -> None:
        problem(path, str(e))

    for folder in walk(root, "skip", on_error=on_error):
        role, _, last = folder.rel.rpartition("/")
        rank = rank_of_dir(last)
        if rank is None or not role:
            continue
        for e in folder.entries:
            if e.name in (TELEMETRY, TELEMETRY_OLD) and e.kind != "file":
                what = "a symbolic link" if e.link else "not a regular file"
                problem(e.path, f"{e.path} is {what}: not read")
        if any(e.name == TELEMETRY and e.kind == "file" for e in folder.entries):
            out.append(((role, rank), folder.path))
    return out


def read_run(root: str) -> TelemetryRun:
    """Every rank's telemetry under the run directory ``root`` (local or mounted)."""
    run = TelemetryRun()
    run.refresh(root)
    return run
