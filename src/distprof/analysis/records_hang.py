"""The typed records of ``distprof hang``: the evidence a rank wrote (:class:`Evidence`, the schema of
``hang.json``, read defensively by :mod:`.hang`) and the verdict (:class:`HangResult`, what ``--json`` prints).

DESIGN.md fixes ``stuck_ranks``, ``collective`` ``{"group", "seq", "name"}`` and per rank ``{"rank", "state",
"step", "phase", "stack"}``; the rest is added.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from distprof.analysis.records import Envelope, Record

__all__ = ["Evidence", "FRDump", "FREntry", "Frame", "GroupHistory", "HangCollective", "HangRank", "HangResult",
           "Recent", "ThreadStack"]

_Rank = Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
_Seq = Annotated[int, msgspec.Meta(ge=0, lt=2**62)]
_Text = Annotated[str, msgspec.Meta(max_length=4096)]
MAX_WORLD = 1 << 20  # the most ranks a hang.json may claim: the verdict lists every rank of the world


# ---- the evidence a rank writes (capture/hang.py; schema of hang.json) ------------------------------------------
class Frame(msgspec.Struct):
    file: _Text = ""
    line: Annotated[int, msgspec.Meta(ge=0, lt=2**31)] = 0
    func: _Text = ""

    def text(self) -> str:
        return f"{self.func} ({self.file}:{self.line})"


class ThreadStack(msgspec.Struct):
    thread: _Text = ""
    ident: int = 0
    main: bool = False
    frames: list[Frame] = []
    """Innermost last."""


class Recent(msgspec.Struct):
    seq: _Seq
    name: _Text = ""
    entered_t: float = 0.0
    completed_t: float | None = None


class GroupHistory(msgspec.Struct):
    """distprof's own record of one process group on one rank (capture/collrec.py)."""
    group: _Text
    entered: _Seq = 0
    entered_name: _Text = ""
    entered_t: float = 0.0
    completed: _Seq = 0
    completed_t: float = 0.0
    recent: list[Recent] = []


class FREntry(msgspec.Struct):
    """One entry of torch's Flight Recorder as the evidence keeps it."""
    collective_seq_id: _Seq = 0
    profiling_name: _Text = ""
    retired: bool = True
    state: _Text = ""
    time_created_ns: int = 0
    is_p2p: bool = False


class FRDump(msgspec.Struct):
    available: bool = False
    reason: _Text = ""
    version: Any = None
    groups: dict[_Text, list[FREntry]] = {}


class Evidence(msgspec.Struct):
    """``{role}/rank{R:05d}/hang.json``: ``state`` running (kept current while steps end), stalled (no step ended
    for ``timeout_s``: stacks and Flight Recorder added), resumed (steps end again) or stopped (the profiler
    stopped; a stalled rank that never went on keeps ``stalled``)."""
    hang: int
    role: _Text
    rank: _Rank
    state: _Text
    world_size: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORLD)] = 0
    pid: int = 0
    host: _Text = ""
    written_t: float = 0.0
    step: _Seq | None = None
    last_progress_t: float = 0.0
    stalled_s: float = 0.0
    timeout_s: float = 0.0
    phase: _Text | None = None
    phase_t: float | None = None
    in_collective: bool = False
    main_ident: int = 0
    groups: list[GroupHistory] = []
    stacks: list[ThreadStack] = []
    flight_recorder: FRDump | None = None


# ---- the verdict ------------------------------------------------------------------------------------------------
class HangCollective(Record, kw_only=True):
    """The first collective some ranks wait in and others never entered: its process ``group`` (torch's name,
    ``"0"`` the default group), sequence number on that group, name; the ranks ``waiting`` there ``since``
    (wall clock, s) and where the numbers come from (``source``: ``distprof`` or ``flight_recorder``)."""
    group: str
    seq: int
    name: str
    waiting: list[int] = msgspec.field(default_factory=list)
    since: float | None = None
    source: str = "distprof"


class HangRank(Record, kw_only=True):
    """One rank: ``state`` stuck (stalled outside any collective), stuck_in_c (stuck in C code holding the GIL:
    only the C watchdog's stacks), waiting (stalled inside a collective), running (steps ended when it last
    wrote), resumed (stalled once, then went on), stopped (the profiler stopped), no_evidence; its ``step`` (in
    progress), outermost annotate ``phase``, ``stack`` (the training thread's frames, innermost last,
    ``func (file:line)``) and ``frame`` (the innermost frame of the job's own code)."""
    rank: int
    state: str
    step: int | None = None
    phase: str | None = None
    stack: list[str] = msgspec.field(default_factory=list)
    role: str | None = None
    frame: str | None = None
    stalled_s: float | None = None
    since: float | None = None
    waiting_in: dict[str, Any] | None = None
    threads: int = 0
    host: str | None = None
    pid: int | None = None
    evidence: list[str] = msgspec.field(default_factory=list)


class HangResult(Envelope):
    """``distprof hang RUN_DIR``: whether the job hangs, the ranks that never arrived at the first unfinished
    collective (``stuck_ranks``), that ``collective``, every rank's state, and the verdict in one sentence."""
    hung: bool
    stuck_ranks: list[int]
    collective: HangCollective | None
    ranks: list[HangRank]
    role: str | None = None
    verdict: str = ""
    flight_recorder: bool = False
