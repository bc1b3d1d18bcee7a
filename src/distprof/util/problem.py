"""The one record of "what went wrong": :class:`Problem`, and the helpers that keep its values short.

Every layer reports a problem the same way: a config field or a dialect's setting (``config.errors``), a trace
file that cannot be read or listed (``trace.listing.find_traces``, ``analysis.parallel.map_files``, the verbs'
``Run.errors``, ``merge``), a node of a Ray cluster that cannot be listed (``analysis.rayfiles``), a file or node
``collect`` could not bring (``CollectReport.errors``). ``str(problem)`` is always the whole line.

Pure and on the ground floor: no pydantic, nothing else of distprof is imported here.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_SHOWN", "MISSING", "Problem", "Unresolved", "clip", "cut", "short", "show"]

MAX_SHOWN = 80  # characters of a value shown in a message

_short = reprlib.Repr()
_short.maxlevel, _short.maxlist, _short.maxtuple, _short.maxdict, _short.maxset = 3, 6, 6, 4, 6
_short.maxstring, _short.maxother, _short.maxlong = 60, 60, 40


def show(value: Any, limit: int = MAX_SHOWN) -> str:
    """A repr for messages that is never longer than ``limit``: the value may be huge or self-referencing."""
    try:
        text = _short.repr(value)
    except Exception:  # a hostile __repr__ must not replace the config error
        text = f"<{type(value).__name__}>"
    return cut(text, limit)


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"

    def __reduce__(self) -> str:
        # Pickled (a problem sent back by a Ray task or a worker process) it stays the one MISSING: `is` holds.
        return "MISSING"


MISSING: Any = _Missing()  # "no value": a problem about a section, a whole config, a file or a node


@dataclass(frozen=True)
class Unresolved:
    """An interpolation distprof does not evaluate (``${oc.env:X}``, custom resolvers, missing keys)."""

    text: str
    why: str

    def __repr__(self) -> str:
        return repr(self.text)


@dataclass(frozen=True)
class Problem:
    """One thing that went wrong, or a warning: the one record of "what went wrong" in distprof. It is
    ``ProfilerConfig``'s validation problem (``ConfigError.problems``), a dialect's translation problem
    (``Translation.errors`` / ``.warnings``), a trace file that cannot be read or listed (the analysis verbs'
    ``errors``, ``find_traces(problems=...)``, ``map_files``), a node that cannot be listed (``--ray``) and a file
    or node ``collect`` could not bring (``CollectReport.errors``). Pure data, no pydantic: any layer can raise or
    report it.

    ``field``: **where**, as the person would name it: a dotted distprof field
    (``per_role.actor.torch.record_shape``), the framework's own field in a dialect (``global_profiler.steps``),
    the ``DISTPROF_*`` variable or command-line flag a value came from, a file path (a trace, a folder, a path
    relative to a collect's destination), or a node (``node 57d99f6b67f3 (10.0.0.7)``, ``PATH on node ...``);
    "" for the whole config. ``path`` is the same, under the name a file or node problem reads best with.
    ``value``: the value at fault (a validation keeps it as a short repr, at most 80 characters, since a config
    value may be huge or hostile; a translation keeps it as read, and clips it when shown; ``MISSING`` when there
    is none, as for every file or node problem). ``message``: the whole line (where, value, what is wrong, the
    fix), what ``str()`` gives. ``reason``: the line without its ``where = value:`` / ``where:`` lead, when it
    has one.
    """

    field: str
    value: Any
    message: str
    reason: str = ""

    @classmethod
    def about(cls, source: str, value: Any, reason: str, text: str = "") -> Problem:
        """A problem with ``source`` (= ``value``) and what is wrong (``reason``); ``text``, when given, is already
        the whole line (a distprof config problem names its field, or variable, and value)."""
        line = text or (f"{source}: {reason}" if value is MISSING else f"{source} = {short(value)}: {reason}")
        return cls(source, value, line, reason)

    @classmethod
    def at(cls, where: str, reason: str, text: str = "") -> Problem:
        """A problem at a file path or a node, with no value: the line is ``where: reason``, or ``text`` when
        given (a message that already is the whole line, as a ``TraceError``'s is)."""
        return cls.about(where, MISSING, reason, text)

    @property
    def source(self) -> str:
        """``field``, under the name a dialect's translation reports it (``--json``'s ``source``)."""
        return self.field

    @property
    def path(self) -> str:
        """``field``, under the name a file or node problem reports it (the analysis ``--json``'s ``path``)."""
        return self.field

    @property
    def text(self) -> str:
        return self.message

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """As ``distprof validate --json`` lists it: ``source``, ``value``, ``message`` (the reason), ``text``."""
        return {"source": self.field, "value": clip(self.value), "message": self.reason or self.message,
                "text": self.message}

    def file_dict(self) -> dict[str, Any]:
        """As the analysis verbs' ``--json`` lists a file it could not read: ``{"path", "message"}`` (the line)."""
        return {"path": self.field, "message": self.message}


# ---- bounded values for messages and JSON -----------------------------------------------------------------
def clip(v: Any, depth: int = 3, items: int = 12, chars: int = 200) -> Any:
    """A small JSON-able copy of ``v`` for reports: long strings, lists and mappings cut, deep parts elided."""
    if v is MISSING:
        return None
    if isinstance(v, Unresolved):
        return v.text[:chars]
    if isinstance(v, str):
        return v if len(v) <= chars else v[:chars - 1] + "…"
    if isinstance(v, (bool, int, float)) or v is None:
        return v
    if depth <= 0:
        return "…"
    if isinstance(v, Mapping):
        out = {str(k)[:chars]: clip(x, depth - 1, items, chars) for k, x in list(v.items())[:items]}
        if len(v) > items:
            out["…"] = f"{len(v) - items} more"
        return out
    if isinstance(v, (list, tuple)):
        out_l = [clip(x, depth - 1, items, chars) for x in list(v)[:items]]
        if len(v) > items:
            out_l.append(f"… {len(v) - items} more")
        return out_l
    return clip(str(v), depth, items, chars)


def short(v: Any) -> str:
    """``v`` as a short readable string for one-line messages."""
    if v is MISSING:
        return "(not set)"
    if isinstance(v, Unresolved):
        return repr(v.text[:120])
    try:
        text = json.dumps(clip(v, depth=2, items=8, chars=80), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(clip(str(v)))
    return text if len(text) <= 160 else text[:159] + "…"
