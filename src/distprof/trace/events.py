"""The events a trace is decoded into: msgspec structs with ``gc=False``, and the decoders built once.

- :class:`Event`: every field of the Trace Event Format (``open_trace(path)``, merge);
- :class:`LeanEvent` and its phases (:class:`Complete`, :class:`Meta`, :class:`Instant`, :class:`Unread`), the tagged
  union :data:`Lean`: what a :class:`~distprof.trace.table.TraceTable` reads (``open_trace(path, lean=True)``);
- :class:`Head`: the document's keys other than ``traceEvents`` that reading uses.

Times are bounded (:data:`Time`, :data:`Duration`) and ids fit int64 (:data:`Int64`): an event outside
those bounds does not decode, and the reader skips and counts it.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

__all__ = [
    "HEAD_KEYS",
    "UNREAD_EVENT",
    "Complete",
    "Duration",
    "Event",
    "Head",
    "Instant",
    "Int64",
    "Lean",
    "LeanEvent",
    "Meta",
    "Time",
    "Unread",
    "event_decoder",
    "head_decoder",
    "lean_decoder",
    "lean_list_decoder",
    "list_decoder",
    "raw_list_decoder",
]

# Times are µs; analyses and merge turn them into int64 ns, so anything at or beyond 9e15 µs is absurd.
Time = Annotated[float, msgspec.Meta(ge=-9e15, le=9e15)]
Duration = Annotated[float, msgspec.Meta(ge=0, le=9e15)]  # a negative duration is a broken event, not a figure
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # ids end up in numpy int64 columns


class Event(msgspec.Struct, gc=False):
    """One trace event: every field of the Trace Event Format (other per-event keys are not kept)."""
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: Time = 0.0
    dur: Duration = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")  # decoded only when an analysis needs it
    id: Int64 | str | None = None  # flow / async / object id
    bp: str | None = None  # flow binding point
    s: str | None = None  # instant-event scope
    tts: float | None = None  # thread clock
    tdur: float | None = None
    id2: msgspec.Raw = msgspec.Raw(b"")  # {"local": ...} or {"global": ...}
    scope: str | None = None
    cname: str | None = None
    sf: Int64 | str | None = None  # stack frame ids (the trace's stackFrames are not kept)
    esf: Int64 | str | None = None
    stack: msgspec.Raw = msgspec.Raw(b"")
    estack: msgspec.Raw = msgspec.Raw(b"")
    bind_id: Int64 | str | None = None  # flow v2
    flow_in: bool | None = None
    flow_out: bool | None = None


class Head(msgspec.Struct, gc=False):
    """The document's keys other than traceEvents (before or after the array) that reading uses."""
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    baseTimeNanoseconds: Int64 | Annotated[float, msgspec.Meta(ge=-9.2e18, le=9.2e18)] | None = None
    distprof: dict[str, Any] | None = None


HEAD_KEYS = frozenset(Head.__struct_fields__)
head_decoder = msgspec.json.Decoder(Head)
list_decoder = msgspec.json.Decoder(list[Event])
raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
event_decoder = msgspec.json.Decoder(Event)


# ---- lean events: what an analysis table reads, and nothing else ----------------------------------------
class LeanEvent(msgspec.Struct, gc=False, tag_field="ph"):
    """A lean stream's events (``open_trace(..., lean=True)``): the class is the phase. Complete and
    metadata events carry what :class:`~distprof.trace.table.TraceTable` reads; every other phase is
    an empty placeholder whose fields the decoder skips instead of building (flows alone are a third of
    a Kineto trace), which makes decoding about a third faster."""


class Complete(LeanEvent, tag="X"):
    name: str = ""
    cat: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: Time = 0.0
    dur: Duration = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")


class Meta(LeanEvent, tag="M"):
    name: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    args: msgspec.Raw = msgspec.Raw(b"")


class Instant(LeanEvent, tag="i"):
    """An instant event: the table keeps profile_memory's ``[memory]`` events (the allocator's totals)."""
    name: str = ""
    ts: Time = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")


class Unread(LeanEvent, tag=""):
    """An event of a phase a table does not read (a valid event all the same: not skipped)."""


# Every other phase of the Trace Event Format; an event of a phase not listed (or without one) is decoded
# whole to tell a valid event from a broken one, then stands as Unread.
_UNREAD = tuple(msgspec.defstruct(f"Unread_{ord(p)}", [], bases=(LeanEvent,), tag=p)
                for p in "BEICbnestfPONDRcSTpFVv()")
_LEAN_TYPES = (Complete, Meta, Instant, Unread, *_UNREAD)
Lean = Union[_LEAN_TYPES]  # type: ignore[valid-type]  # noqa: UP007 (a union of a tuple of classes)
lean_list_decoder = msgspec.json.Decoder(list[Lean])
lean_decoder = msgspec.json.Decoder(Lean)
UNREAD_EVENT = Unread()
