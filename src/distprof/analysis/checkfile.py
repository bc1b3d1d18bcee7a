"""One file of a run directory, as ``check`` judges it: there, of the size its manifest line records, and whole
(a trace streamed through the analysis reader, bounded in memory whatever its size or compression; a tool's
JSON decoded when small, judged by its ends when large). Read only through :class:`~.view.RunView`."""

from __future__ import annotations

from typing import Any

import msgspec

from distprof.analysis.runview import RunView, ViewError
from distprof.rundir.layout import is_process_output, is_ray_timeline, rank_of_process_output
from distprof.rundir.manifest import MANIFEST_LIMIT

__all__ = ["check_file", "json_whole", "process_outputs", "ranks_without_output", "short"]

_MAGIC = {".bin": (b"\x04\x22\x4d\x18", b"memray")}  # memray: lz4 frame, or its raw header


def process_outputs(view: RunView, tree: Any, role: str, backend: str) -> list[tuple[str, str, str]]:
    """(path, status, detail) of each process tool's output in a role folder (none: an empty list)."""
    dirs, files = tree.get(role, ([], []))
    out = []
    for n in sorted(n for n in dirs + files if is_process_output(n, backend)):
        rel = f"{role}/{n}"
        status, detail = "ok", ""
        try:
            if n in dirs:
                if not any(tree.get(rel, ([], []))):
                    status, detail = "broken", "empty output directory"
            elif not view.size(rel):
                status, detail = "broken", "empty file"
            elif n.endswith(".json"):
                status, detail = json_whole(view, rel)
            elif n.endswith(".bin"):
                if not (view.read_small(rel, 8) or b"").startswith(_MAGIC[".bin"]):
                    status, detail = "broken", "not a memray capture"
        except ViewError as e:
            status, detail = "broken", str(e).split(": ", 1)[-1]
        out.append((rel, status, detail))
    return out


def ranks_without_output(found: list[tuple[str, str, str]], config: Any, world: int, max_ranks: int) -> list[int]:
    """The ranks ``config`` selects that have no output of their own, where outputs name their rank (``distprof
    wrap``'s; a Ray worker's name only its wrapper's pid) and the selection is a rank list or ``all``."""
    have = {r for rel, _, _ in found if (r := rank_of_process_output(rel)) is not None}
    if not have or isinstance(config.ranks, dict) or config.per_node is not None or world > max_ranks:
        return []
    expected = range(world) if config.ranks == "all" else [r for r in config.ranks if r < world]
    return [r for r in expected if r not in have]


def check_file(view: RunView, rel: str, size: int) -> tuple[str, str]:
    try:
        got = view.size(rel)
    except ViewError as e:
        return "broken", str(e).split(": ", 1)[-1]
    if got is None:
        return "missing", "listed in the manifest but not on disk"
    if got != size:  # cheap, and catches most truncations before any decoding
        return "broken", f"{got} bytes on disk, manifest says {size}"
    if is_ray_timeline(rel):  # not a trace: one JSON object (distprof.integrations.ray.timeline)
        return _timeline_whole(view, rel)
    if rel.endswith((".json", ".json.gz")):
        return _decodes(view, rel)
    return "ok", ""


def _decodes(view: RunView, rel: str) -> tuple[str, str]:
    """Stream the trace through the analysis reader: memory stays bounded (a gzip bomb inflates piece by piece)."""
    from distprof.trace.reader import open_trace
    from distprof.trace.source import TraceError

    try:
        stream = open_trace(view.stream_path(rel), lean=True)
        for _ in stream.batches():
            pass
    except ViewError as e:
        return "broken", str(e).split(": ", 1)[-1]
    except (TraceError, OSError) as e:
        return "broken", f"does not decode: {short(str(e).split(': ', 1)[-1])}"
    if stream.report.truncated or stream.report.bytes_unread:
        return "broken", f"read only in part: {short('; '.join(stream.report.notes[:2]) or 'cut off')}"
    return "ok", ""


def _timeline_whole(view: RunView, rel: str) -> tuple[str, str]:
    """A Ray timeline: decoded and checked by its one reader (bounded)."""
    from distprof.analysis.ray_timeline import LIMIT, TimelineError, parse

    try:
        parse(view.read_small(rel, LIMIT + 1) or b"", rel)
    except ViewError as e:
        return "broken", str(e).split(": ", 1)[-1]
    except TimelineError as e:
        return "broken", short(str(e).split(": ", 1)[-1])
    return "ok", ""


def json_whole(view: RunView, rel: str) -> tuple[str, str]:
    """A tool's JSON output (py-spy's speedscope): decoded whole when small; a large one is judged by its ends."""
    if (view.size(rel) or 0) > MANIFEST_LIMIT:
        head, tail = view.read_small(rel, 64) or b"", view.read_tail(rel, 64)
        if head.lstrip()[:1] in (b"{", b"[") and tail.rstrip()[-1:] in (b"}", b"]"):
            return "ok", f"larger than {MANIFEST_LIMIT >> 20} MB: only its first and last bytes checked"
        return "broken", "does not look like JSON (first or last bytes)"
    try:
        msgspec.json.decode(view.read_small(rel, MANIFEST_LIMIT) or b"")
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
        return "broken", f"does not decode: {short(e)}"
    return "ok", ""


def short(e: Any) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."
