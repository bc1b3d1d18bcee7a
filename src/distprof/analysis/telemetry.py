"""Reading the ranks' step telemetry (``telemetry: true``; the writer and the format: distprof.capture.telemetry).

One :class:`StreamReader` per rank follows that rank's stream incrementally (the watcher reads only what was
appended since its last look, the verbs read it once); :func:`read_run` reads every rank of a run directory into
one :class:`RankSeries` per (role, rank). The streams are untrusted input like any trace: a line that is torn (a
kill -9 mid-write), too long, not JSON or of the wrong shape is skipped and counted, a file is read at most
``MAX_READ`` bytes from its end, symbolic links are never followed (the one walker, ``links="skip"``), and a
stream that cannot be read is one :class:`~distprof.util.problem.Problem`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import msgspec

from distprof.rundir.layout import TELEMETRY, TELEMETRY_OLD, rank_of_dir
from distprof.rundir.walk import walk
from distprof.util.problem import Problem

__all__ = ["MAX_LINE", "MAX_READ", "RankSeries", "StepRecord", "StreamReader", "TelemetryRun", "read_run"]

MAX_LINE = 64 * 1024  # a step line is ~100 bytes; one longer than this is not ours
MAX_READ = 256 * 1024 * 1024  # bytes read from one file at most (its newest part); streams rotate far below this


class StepRecord(msgspec.Struct, frozen=True):
    """One step of one rank: its number, when it ended (unix s), its wall time and its phases (µs)."""

    step: int
    t: float
    dur_us: int
    phases: dict[str, int] = {}


class _Header(msgspec.Struct):
    telemetry: int
    role: str
    rank: int
    world_size: int = 0
    pid: int = 0
    host: str = ""


_STEP = msgspec.json.Decoder(StepRecord)
_HEADER = msgspec.json.Decoder(_Header)


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
        if self.steps and records[0].step <= self.steps[-1].step:  # a restart, or an older segment read late
            by_step = {r.step: r for r in self.steps}
            by_step.update((r.step, r) for r in records)
            self.steps = [by_step[s] for s in sorted(by_step)]
        else:
            self.steps.extend(records)


class StreamReader:
    """Follows one rank's stream (``telemetry.jsonl``), and its rotated segment on the first read.

    :meth:`read` returns the step lines appended since the last call. A rotation (the file replaced by a new
    one: another inode, or shorter than what was read) starts again at the new file's beginning; the rest of
    the old segment, written between the last read and the rotation, is read from ``telemetry.1.jsonl``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path = os.path.join(folder, TELEMETRY)
        self.header: _Header | None = None
        self.skipped = 0
        self._ino: int | None = None
        self._pos = 0
        self._partial = b""
        self._started = False

    def read(self) -> list[StepRecord]:
        """New step lines (OSError when the stream cannot be read at all)."""
        out: list[StepRecord] = []
        if not self._started:
            self._started = True
            old = os.path.join(self.folder, TELEMETRY_OLD)
            try:
                out += self._lines(_read_file(old, 0)[0], final=True)
            except FileNotFoundError:
                pass
        st = os.lstat(self.path)
        if not _regular(st.st_mode):
            raise OSError(f"{self.path} is not a regular file")
        if self._ino is not None and (st.st_ino != self._ino or st.st_size < self._pos):
            old = os.path.join(self.folder, TELEMETRY_OLD)  # rotated: finish the old segment first
            try:
                ost = os.lstat(old)
                if ost.st_ino == self._ino and _regular(ost.st_mode):
                    out += self._lines(_read_file(old, self._pos)[0], final=True)
            except OSError:
                pass
            self._pos, self._partial = 0, b""
        self._ino = st.st_ino
        data, self._pos = _read_file(self.path, self._pos)
        out += self._lines(data, final=False)
        return out

    def _lines(self, data: bytes, final: bool) -> list[StepRecord]:
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = b"" if final else lines.pop()  # an unfinished last line waits for the rest
        if len(self._partial) > MAX_LINE:
            self._partial, self.skipped = b"", self.skipped + 1
        out = []
        for line in lines:
            if not line.strip():
                continue
            if len(line) > MAX_LINE:
                self.skipped += 1
                continue
            try:
                out.append(_STEP.decode(line))
                continue
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
            try:
                self.header = _HEADER.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.skipped += 1
        return out


def _regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def _read_file(path: str, pos: int) -> tuple[bytes, int]:
    """The bytes of ``path`` from ``pos`` (at most MAX_READ, the newest), never through a link; and the new end."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not _regular(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        end = st.st_size
        start = max(pos, end - MAX_READ)
        os.lseek(fd, start, os.SEEK_SET)
        chunks, left = [], end - start
        while left > 0:
            b = os.read(fd, min(left, 1 << 24))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if start > pos:  # skipped the oldest part: drop the line cut in two
            data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
        return data, start + sum(map(len, chunks))
    finally:
        os.close(fd)


@dataclass
class TelemetryRun:
    """Every rank's telemetry in a run directory."""

    series: dict[tuple[str, int], RankSeries] = field(default_factory=dict)
    errors: list[Problem] = field(default_factory=list)
    readers: dict[tuple[str, int], StreamReader] = field(default_factory=dict)

    def roles(self) -> list[str]:
        return sorted({role for role, _ in self.series})

    def refresh(self, root: str) -> int:
        """Read what every stream appended since the last refresh (new ranks found too); the steps added."""
        added = 0
        for (role, rank), folder in _streams(root, self.errors):
            key = (role, rank)
            reader = self.readers.get(key)
            if reader is None:
                reader = self.readers[key] = StreamReader(folder)
            try:
                records = reader.read()
            except OSError as e:
                if not any(p.path == reader.path for p in self.errors):
                    self.errors.append(Problem.at(reader.path, str(e)))
                continue
            s = self.series.get(key)
            if s is None:
                s = self.series[key] = RankSeries(role, rank)
            h = reader.header
            if h is not None:
                s.world_size = h.world_size or s.world_size
                if h.host and h.host not in s.hosts:
                    s.hosts.append(h.host)
                if h.pid and h.pid not in s.pids:
                    s.pids.append(h.pid)
            s.add(records)
            s.skipped = reader.skipped
            added += len(records)
        return added


def _streams(root: str, errors: list[Problem]) -> list[tuple[tuple[str, int], str]]:
    """((role, rank), folder) of every rank folder under ``root`` that holds a telemetry stream."""
    out = []

    def on_error(path: str, rel: str, e: Exception) -> None:
        errors.append(Problem.at(path, str(e)))

    for folder in walk(root, "skip", on_error=on_error):
        if not any(e.name == TELEMETRY and e.kind == "file" for e in folder.entries):
            continue
        rel = folder.rel
        role, _, last = rel.rpartition("/")
        rank = rank_of_dir(last)
        if rank is None or not role:
            continue
        out.append(((role, rank), folder.path))
    return out


def read_run(root: str) -> TelemetryRun:
    """Every rank's telemetry under the run directory ``root`` (local or mounted)."""
    run = TelemetryRun()
    run.refresh(root)
    return run
