"""``distprof hang RUN_DIR``: which rank the job waits for, from the evidence every rank wrote (capture/hang.py).

Reads each rank folder's ``hang.json`` (:class:`~.records_hang.Evidence`) and ``hang-stacks.txt`` (faulthandler's
dump, written when the rank was stuck in C code holding the GIL), both untrusted: bounded reads, never through a
link, a file that does not parse is an error of the result (exit 1), never a traceback.

Matching: per role and process group, each rank's last entered and completed collective (distprof's own record,
sequence numbers counted per group; for a group only torch's Flight Recorder saw, such as DDP's bucket
all-reduces, the recorder's ``collective_seq_id`` and ``retired``). The ranks inside a collective wait at the
number they entered; the first unfinished collective is the lowest of those, and the ranks whose record stops
before it never arrived: the stuck ranks. Where each of them is comes from its evidence (state, step, phase,
stack). Without any waiting rank, the stuck ranks are the stalled ones.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from distprof.analysis.records_hang import Evidence, Frame, HangCollective, HangRank, HangResult, ThreadStack
from distprof.rundir.layout import HANG, HANG_STACKS, rank_of_dir
from distprof.rundir.walk import walk
from distprof.trace.vocab import collective_name
from distprof.util.intervals import ranges_text

__all__ = ["HangInput", "analyse", "clock_text", "hang_result", "parse_stacks", "read_evidence", "verdict_text"]

MAX_EVIDENCE = 16 << 20  # bytes of one hang.json read at most
MAX_STACKS = 4 << 20  # bytes of one hang-stacks.txt read at most (its end: the newest dump)
STUCK = ("stuck", "stuck_in_c")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_LIB = ("/site-packages/", "/dist-packages/", "/distprof/", "/lib/python3", "<frozen ")


@dataclass
class RankInput:
    role: str
    rank: int
    folder: str
    evidence: Evidence | None = None
    stacks: list[ThreadStack] | None = None  # from hang-stacks.txt
    stacks_t: float = 0.0  # its modification time


@dataclass
class HangInput:
    """What the run directory holds: per (role, rank) its evidence, and the files that could not be read."""
    ranks: dict[tuple[str, int], RankInput] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)


def _read(path: str, limit: int, tail: bool = False) -> tuple[bytes, float]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if st.st_size > limit and not tail:
            raise OSError(f"{st.st_size} bytes, over the {limit} this reader takes")
        if st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks, left = [], limit
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks), st.st_mtime
    finally:
        os.close(fd)


def parse_stacks(text: str) -> list[ThreadStack]:
    """The last dump in faulthandler's output (``Timeout (...)!`` then one block per thread, innermost first) as
    thread stacks, innermost last; the dumping thread (``Current thread``) is faulthandler's own, left out."""
    start = text.rfind("Timeout (")
    stacks: list[ThreadStack] = []
    cur: ThreadStack | None = None
    for line in text[max(start, 0):].splitlines()[:100_000]:
        m = _THREAD.match(line)
        if m:
            cur = ThreadStack(thread=m.group(2), ident=int(m.group(2), 16))
            if m.group(1) == "Thread":
                stacks.append(cur)
            continue
        f = _FRAME.match(line)
        if f and cur is not None and len(cur.frames) < 256:
            cur.frames.insert(0, Frame(file=f.group(1)[:4096], line=min(int(f.group(2)[:9]), 2**31 - 1),
                                       func=f.group(3)[:4096]))
    return stacks


def read_evidence(root: str) -> HangInput:
    """Every rank's hang evidence under the run directory ``root`` (local or mounted)."""
    out = HangInput()

    def err(path: str, message: str) -> None:
        out.errors.append({"path": path, "message": message[:500]})

    for folder in walk(root, "skip", on_error=lambda p, _rel, e: err(p, str(e))):
        role, _, last = folder.rel.rpartition("/")
        rank = rank_of_dir(last)
        if rank is None or not role:
            continue
        for e in folder.entries:
            if e.name not in (HANG, HANG_STACKS):
                continue
            if e.kind != "file":
                err(e.path, f"{e.path} is {'a symbolic link' if e.link else 'not a regular file'}: not read")
                continue
            ri = out.ranks.setdefault((role, rank), RankInput(role, rank, folder.path))
            try:
                if e.name == HANG:
                    data, _ = _read(e.path, MAX_EVIDENCE)
                    ev = msgspec.json.decode(data, type=Evidence)
                    if ev.rank != rank:
                        raise ValueError(f"it names rank {ev.rank}, but lies in the folder of rank {rank}")
                    ri.evidence = ev
                else:
                    data, mtime = _read(e.path, MAX_STACKS, tail=True)
                    ri.stacks, ri.stacks_t = parse_stacks(data.decode("utf-8", "replace")), mtime
            except (OSError, ValueError, msgspec.DecodeError) as x:
                err(e.path, f"{e.path}: {x}")
    return out


# ---- matching ---------------------------------------------------------------------------------------------------
@dataclass
class _Pos:
    """One rank's position on one group: entered and completed sequence numbers, the name at each number."""
    entered: int
    completed: int
    names: dict[int, str]
    since: float | None


def _own(ev: Evidence) -> dict[str, _Pos]:
    out = {}
    for g in ev.groups:
        names = {r.seq: r.name for r in g.recent}
        names.setdefault(g.entered, g.entered_name)
        out[g.group] = _Pos(g.entered, g.completed, names, g.entered_t if g.entered > g.completed else None)
    return out


def _recorder(ev: Evidence) -> dict[str, _Pos]:
    out: dict[str, _Pos] = {}
    fr = ev.flight_recorder
    if fr is None or not fr.available:
        return out
    for name, entries in fr.groups.items():
        es = [e for e in entries if not e.is_p2p and e.collective_seq_id > 0]
        if not es:
            continue
        entered = max(e.collective_seq_id for e in es)
        pending = [e for e in es if not e.retired]
        first = min(pending, key=lambda e: e.collective_seq_id) if pending else None
        completed = entered if first is None else first.collective_seq_id - 1
        out[name] = _Pos(entered, completed, {e.collective_seq_id: collective_name(e.profiling_name) for e in es},
                         None if first is None else first.time_created_ns / 1e9)
    return out


def _state(ri: RankInput) -> str:
    ev = ri.evidence
    if ev is None:
        return "stuck_in_c" if ri.stacks else "no_evidence"
    if ev.state == "stalled":
        pending = ev.in_collective or any(p.entered > p.completed for p in _recorder(ev).values())
        return "waiting" if pending else "stuck"
    if ri.stacks and ri.stacks_t >= ev.written_t:  # the C watchdog fired after the last write: stuck with the GIL
        return "stuck_in_c"
    return ev.state if ev.state in ("resumed", "stopped") else "running"


def _stack(ri: RankInput) -> list[ThreadStack]:
    ev = ri.evidence
    if ri.stacks and (ev is None or ev.state != "stalled"):
        main = ev.main_ident if ev is not None else 0
        return [ThreadStack(thread=s.thread, ident=s.ident, main=s.ident == main, frames=s.frames)
                for s in ri.stacks]
    return list(ev.stacks) if ev is not None else []


def _frame(frames: list[Frame]) -> str | None:
    for f in reversed(frames):
        if not any(x in f.file for x in _LIB):
            return f.text()
    return frames[-1].text() if frames else None


def _rank_view(ri: RankInput, state: str) -> HangRank:
    ev = ri.evidence
    stacks = _stack(ri)
    main = next((s for s in stacks if s.main), stacks[0] if stacks else None)
    frames = main.frames if main is not None else []
    files = [os.path.join(ri.folder, n) for n, ok in ((HANG, ev is not None), (HANG_STACKS, bool(ri.stacks))) if ok]
    return HangRank(rank=ri.rank, role=ri.role, state=state, step=None if ev is None else ev.step,
                    phase=None if ev is None else ev.phase, stack=[f.text() for f in frames[-24:]],
                    frame=_frame(frames), stalled_s=None if ev is None else ev.stalled_s,
                    since=None if ev is None else ev.last_progress_t, threads=len(stacks),
                    host=None if ev is None else ev.host, pid=None if ev is None else ev.pid, evidence=files)


def _collective(ranks: dict[int, RankInput], expected: Iterable[int]) -> tuple[HangCollective | None, list[int]]:
    """The first unfinished collective of the role and the ranks that never arrived at it."""
    best: tuple[float, HangCollective, list[int]] | None = None
    for source, pos_of in (("distprof", _own), ("flight_recorder", _recorder)):
        pos = {r: pos_of(ri.evidence) for r, ri in ranks.items() if ri.evidence is not None}
        for g in sorted({g for p in pos.values() for g in p}):
            members = set(expected) if g in ("0", "default") else set(ranks)
            found = _pending(g, {r: p[g] for r, p in pos.items() if g in p}, members, source)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is not None:
            return best[1], best[2]
    return None, []


def _pending(g: str, here: dict[int, _Pos], members: set[int], source: str
             ) -> tuple[float, HangCollective, list[int]] | None:
    """Group ``g``'s first unfinished collective (``here``: the ranks that recorded the group), the ranks of
    ``members`` that never arrived, and when the first waiter entered (the key that picks the group)."""
    waiting = {r: p for r, p in here.items() if p.entered > p.completed}
    if not waiting:
        return None
    seq = min(p.entered for p in waiting.values())
    at = sorted(r for r, p in waiting.items() if p.entered >= seq > p.completed)
    missing = sorted(r for r in members | set(here) if r not in here or here[r].entered < seq)
    if not missing:
        return None
    name = next((here[r].names[seq] for r in at if seq in here[r].names), "?")
    since = min((s for r in at if (s := here[r].since)), default=None)
    coll = HangCollective(group=g, seq=seq, name=name, waiting=at, since=since, source=source)
    return (since if since is not None else float("inf")), coll, missing


def analyse(data: HangInput) -> HangResult:
    """The verdict over every role's evidence: the first role with a hang (the earliest stall) is the one told."""
    roles: dict[str, dict[int, RankInput]] = {}
    for (role, rank), ri in sorted(data.ranks.items()):
        roles.setdefault(role, {})[rank] = ri
    results = [_role_result(role, ranks) for role, ranks in roles.items()]
    hung = [r for r in results if r.hung]
    pick = min(hung, key=lambda r: min((x.since or 0) for x in r.ranks)) if hung else None
    res = pick or (results[0] if results else HangResult(hung=False, stuck_ranks=[], collective=None, ranks=[]))
    if pick is not None and len(results) > 1:
        res.ranks += [x for r in results if r is not pick for x in r.ranks]
    res.errors = data.errors
    res.verdict = verdict_text(res)
    return res


def _role_result(role: str, ranks: dict[int, RankInput]) -> HangResult:
    world = max((ri.evidence.world_size for ri in ranks.values() if ri.evidence is not None), default=0)
    expected = set(range(world)) | set(ranks) if world else set(ranks)
    states = {r: _state(ri) for r, ri in ranks.items()}
    views = {r: _rank_view(ri, states[r]) for r, ri in ranks.items()}
    for r in sorted(expected - set(ranks)):
        views[r] = HangRank(rank=r, role=role, state="no_evidence")
    stalled = any(s in ("stuck", "stuck_in_c", "waiting") for s in states.values())
    coll, missing = _collective(ranks, expected) if stalled else (None, [])
    if coll is not None:
        for r in coll.waiting:
            views[r].waiting_in = {"group": coll.group, "seq": coll.seq, "name": coll.name, "since": coll.since}
        stuck = missing
    else:
        stuck = sorted(r for r, s in states.items() if s in STUCK)
    fr = any(ri.evidence is not None and ri.evidence.flight_recorder is not None
             and ri.evidence.flight_recorder.available for ri in ranks.values())
    return HangResult(hung=stalled, stuck_ranks=stuck, collective=coll, ranks=[views[r] for r in sorted(views)],
                      role=role, flight_recorder=fr)



def verdict_text(res: HangResult) -> str:
    """The verdict in one sentence (the terminal's first line; ``verdict`` in --json)."""
    if not res.ranks:
        return "no hang evidence"
    if not res.hung:
        resumed = [x.rank for x in res.ranks if x.state == "resumed"]
        extra = (f" (rank {ranges_text(resumed, ',')} stalled past the timeout once and went on: slow, not hung)"
                 if resumed else "")
        return f"no hang: every rank with evidence was still ending steps{extra}"
    by = {x.rank: x for x in res.ranks}
    where, silent = [], []
    for r in res.stuck_ranks:
        x = by.get(r)
        if x is None or x.state == "no_evidence":
            silent.append(r)  # told once, as ranges: a world of thousands where few ranks wrote
            continue
        bits = [f"in {x.frame}" if x.frame else "", f"step {x.step}" if x.step is not None else "",
                f"phase {x.phase}" if x.phase else "", "holding the GIL in C code" if x.state == "stuck_in_c" else ""]
        where.append(f"rank {r} is " + ", ".join(b for b in bits if b))
    if silent:
        where.append(f"rank{'s' if len(silent) > 1 else ''} {ranges_text(silent, ',')} wrote no evidence")
    c = res.collective
    if c is None:
        who = f"rank{'s' if len(res.stuck_ranks) > 1 else ''} {ranges_text(res.stuck_ranks, ',')}"
        return f"{who} stopped ending steps outside any recorded collective; " + "; ".join(where)
    ranks = f"rank{'s' if len(res.stuck_ranks) > 1 else ''} {ranges_text(res.stuck_ranks, ',')}"
    waiting = f"rank {c.waiting[0]} waits" if len(c.waiting) == 1 else f"ranks {ranges_text(c.waiting, ',')} wait"
    return (f"{ranks} never entered {c.name} #{c.seq} of group {c.group} (seq {c.seq}); {waiting} "
            f"there{' since ' + clock_text(c.since) if c.since else ''}; " + "; ".join(where))


def clock_text(t: float | None) -> str:
    """``t`` (wall clock, s) as local ``HH:MM:SS``; "" for none, "?" for a time the platform cannot show (hostile
    evidence: 1e300, far past 2**62 ns)."""
    if not t:
        return ""
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return "?"


def hang_result(path: str) -> HangResult:
    """``distprof hang PATH`` as a record. Raises ``FileNotFoundError`` when PATH is not a folder, ``ValueError``
    when it holds no hang evidence at all (the CLI's exit 2)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a run directory (a local or mounted folder)")
    data = read_evidence(path)
    if not data.ranks:
        why = "; ".join(e["message"] for e in data.errors[:3])
        raise ValueError(f"{path} holds no hang evidence ({HANG}); was the job run with hang: {{enabled: true}}?"
                         + (f" ({why})" if why else ""))
    return analyse(data)
