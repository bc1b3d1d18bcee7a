"""``merge --format perfetto``: the per-rank traces, unchanged, in one TAR archive with a ``perfetto_manifest``
that makes Perfetto open them as one timeline: one machine per file (named ``{role} rank {R}``, as the merged
JSON names its tracks) and each file's clock related to the first one's.

The format (google/perfetto, ``docs/reference/perfetto-manifest.md``; the reader is
``src/trace_processor/plugins/perfetto_manifest/perfetto_manifest_reader.cc``): a ZIP or TAR archive holding trace
files and one JSON document ``{"perfetto_manifest": {"version": 1, "files": [...], "attributes": {...}}}``, found by
its content wherever it sits in the archive. Trace Processor (and so the UI, which runs it) imports such an archive
as one merged trace since **Perfetto v58.0** (CHANGELOG, 2026-08-06: "Added trace merging: a ZIP or TAR archive
containing several traces imports as one merged trace ..."); v58.2 is the release this was written against. An
older Perfetto opens the archive's files but not the manifest's machines and clocks.

What the format decides here:

- **Members are the traces' JSON bytes, not their gzip.** Perfetto reads a gzip member inside the archive, but
  gzip is a container to it, and a manifest override (``machine``, ``clocks``) on a container is refused:
  ``forwarding_trace_parser.cc``, "perfetto_manifest: overrides are not supported for trace files which are
  themselves archives ..."; the JSON inside it is registered under the empty name, which no entry can match
  (``decompressing_trace_reader.cc``, ``AddFile("")``). So a ``.json.gz`` trace is inflated into its member: the
  member's bytes are exactly the JSON the ``.gz`` holds, and a plain ``.json`` trace is copied byte for byte;
  no event is decoded or written again.
- **Clocks.** Chrome JSON has no clock of its own: each file gets a private timeline (``TraceClockPolicy::
  kTraceFile``) and, with nothing else said, is laid at zero offset against the others. Kineto's ``ts`` is relative
  to ``baseTimeNanoseconds`` (which Perfetto ignores), older traces' is epoch µs, so each file after the first gets
  ``"clocks": {"sync_to": {"file": FIRST}, "offset_ns": N}`` (a *pin*: ``clock`` left out, as the reference
  prescribes for clockless formats): N is the difference of the two files' time bases (distprof's reader's
  ``offset_us``), so every event lands at its absolute time. The first member (by name: ``00000-...``) is the file
  that starts earliest: it claims the merged trace's clock (the first JSON file parsed does; the archive's
  members are parsed in name order, ``archive_entry.cc``), so no event lands before its start (those would be
  dropped, ``trace_sorter_negative_timestamp_dropped``).
- **Machines.** Every file gets ``"machine": {"name": "{role} rank {R}"}``: two ranks never share a process track
  even when their pids or GPU ids agree (Kineto's GPU tracks are ``pid`` = device index on every node).
- **TAR as written**: GNU tar headers (Perfetto's ``tar_trace_reader.cc`` reads ustar and GNU headers, GNU long
  names and base-256 sizes; PAX headers are skipped, so none is written); member names never start with ``.``
  (hidden members are ignored) and stay under 100 characters.
- **Size.** The UI runs Trace Processor in the browser (WebAssembly), and the TAR reader holds every member in
  memory until the archive ends, then parses each; Perfetto puts the browser's bound at about 2 GB and a trace's
  parsed form is several times its JSON. An archive holding more than
  :data:`~distprof.analysis.merge.VIEWER_LIMIT_BYTES` of JSON is written with a warning: open it with
  ``trace_processor server http merged.tar`` (the UI then uses the native process; docs/visualization/
  large-traces.md), or select fewer ranks, roles or steps.

Selection: ``--ranks`` / ``--roles`` pick files as ``merge`` does (manifest first, then what each file says);
``--steps`` picks the files holding those steps, whole (the bytes are copied, so events outside the steps stay).
Files are read once by merge's first pass (rank, role, time base, steps), then copied.
"""

from __future__ import annotations

import logging
import os
import re
import tarfile
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import msgspec

from distprof.analysis.analyze import nothing_read
from distprof.analysis.merge import VIEWER_LIMIT_BYTES, _first_pass, _labels, _selected
from distprof.analysis.merge_scan import _Scan
from distprof.analysis.parallel import Progress
from distprof.analysis.writing import atomic_output, check_output
from distprof.trace.listing import find_traces
from distprof.trace.selection import Selection
from distprof.trace.source import TraceError, byte_chunks
from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST_NAME", "archive_traces", "member_name"]

MANIFEST_NAME = "perfetto_manifest.json"  # the name Perfetto's own tools give it (any name works: found by content)
_CHUNK = 1 << 20
_BLOCK = tarfile.BLOCKSIZE
_NAME_CHARS = 90  # a member name fits a tar header's 100 characters (no long-name record needed)
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def member_name(index: int, label: str) -> str:
    """The archive member of the ``index``-th file (sorting in archive order), from its track label:
    ``00003-actor_rank_3.json``. Never hidden (no leading dot), never a folder, under 100 characters."""
    slug = _SAFE.sub("_", label).strip("._") or "trace"
    return f"{index:05d}-{slug}"[:_NAME_CHARS - 5] + ".json"


def _header(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, int(mtime), 0o644, tarfile.REGTYPE
    return info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")


def _add_bytes(f: BinaryIO, name: str, data: bytes) -> None:
    f.write(_header(name, len(data), time.time()))
    f.write(data)
    f.write(b"\0" * (-len(data) % _BLOCK))


def _add_trace(f: BinaryIO, name: str, path: str, on_read: Callable[[int], None] | None) -> tuple[int, list[str]]:
    """Copy the JSON bytes of ``path`` (inflated when gzip) into the archive as ``name``: the header is written
    with the size once the bytes are in (seek back). Returns (bytes, what was wrong with the file); on an error
    the archive is cut back to where the member began and the TraceError raised."""
    start = f.tell()
    problem: list[str] = []
    size = 0
    try:
        f.write(_header(name, 0, 0))
        for chunk in byte_chunks(path, _CHUNK, on_read, problem):
            f.write(chunk)
            size += len(chunk)
    except BaseException:
        f.seek(start)
        f.truncate()
        raise
    f.write(b"\0" * (-size % _BLOCK))
    end = f.tell()
    try:
        mtime = os.stat(path.removeprefix("file://")).st_mtime
    except (OSError, ValueError):
        mtime = time.time()
    f.seek(start)
    f.write(_header(name, size, mtime))  # same length: GNU headers are one block (base-256 past 8 GB)
    f.seek(end)
    return size, problem


def _manifest(written: list[tuple[str, _Scan, str]], path: str) -> bytes:
    """The ``perfetto_manifest`` document for the members ``written`` (name, scan, label), the first the reference."""
    ref_name, ref, _ = written[0]
    files = []
    for name, scan, label in written:
        entry: dict[str, Any] = {"path": name, "machine": {"name": label}}
        if name != ref_name:
            entry["clocks"] = {"sync_to": {"file": ref_name},
                               "offset_ns": round((scan.offset_us - ref.offset_us) * 1000.0)}
        files.append(entry)
    attributes = {"distprof.source": path, "distprof.files": len(written),
                  "distprof.base_time_ns": round(ref.first_us * 1000.0)}
    return msgspec.json.encode({"perfetto_manifest": {"version": 1, "files": files, "attributes": attributes}})


def _order(scans: list[_Scan], root: str) -> list[tuple[_Scan, str]]:
    """The files in archive order with their labels: the one that starts earliest first, then track order."""
    labelled = list(zip(scans, _labels(scans, root), strict=True))
    first = min(range(len(labelled)), key=lambda i: (labelled[i][0].first_us, i))
    return [labelled[first], *labelled[:first], *labelled[first + 1:]]


def archive_traces(path: str, out: str, selection: Selection | None = None,
                   progress: Callable[[int, int], None] | None = None, workers: int | None = None) -> dict[str, Any]:
    """Write every trace under ``path`` (the ``selection``'s ranks, roles and steps) into the TAR archive ``out``
    with a ``perfetto_manifest`` (see the module's docstring), through the one atomic writer: ``out`` appears whole
    or not at all. Returns merge's keys (``out``, ``files``, ``errors``, ``salvaged``, ``files_read``, ``skipped``,
    ``scope``, ``warnings``, ``conflicts``, ``base_time_us``) and ``format`` ("perfetto"), ``json_bytes`` (the
    members' bytes), ``members`` (``[{"name", "path", "role", "rank", "bytes", "offset_ns"}]``) and ``manifest``
    (the document written); raises TraceError when no file could be read or ``out`` cannot be written."""
    selection = selection or Selection()
    if not out.endswith(".tar"):
        raise TraceError(f"{out}: merge --format perfetto writes a TAR archive; give a name ending in .tar, "
                         "such as merged.tar")
    errors: list[Problem] = []
    found = find_traces(path, errors)
    check_output(out, [f.path for f in found], "merge", "merged.tar")
    files = _selected(found, selection)
    total = 2 * len(files)
    done = [0]

    def report(p: Progress) -> None:
        if progress:
            progress(p.files_done, total)

    scans, skipped = _first_pass(files, selection, workers, report if progress else None, errors)
    skipped += len(found) - len(files)
    if not scans:
        why = "; ".join(map(str, errors)) or ("no trace matches the selection" if files else "no trace files found")
        raise nothing_read(f"{path}: no readable trace ({why})", errors)
    done[0] = len(files)
    written: list[tuple[str, _Scan, str]] = []
    members: list[dict[str, Any]] = []
    salvaged: list[dict[str, Any]] = []
    sizes: list[int] = []
    json_bytes = 0
    with atomic_output(out) as f:
        for scan, label in _order(scans, path):
            name = member_name(len(written), label)
            try:
                size, problem = _add_trace(f, name, scan.path, None)
            except TraceError as e:  # changed or gone since the first pass: the others are archived
                errors.append(Problem.at(scan.path, str(e).removeprefix(f"{scan.path}: "), text=str(e)))
                continue
            finally:
                done[0] += 1
                if progress:
                    progress(done[0], total)
            written.append((name, scan, label))
            sizes.append(size)
            json_bytes += size
            if problem:
                salvaged.append({"path": scan.path, "notes": problem})
        if not written:
            raise nothing_read(f"{path}: no readable trace ({'; '.join(map(str, errors))})", errors)
        manifest = _manifest(written, path)
        _add_bytes(f, MANIFEST_NAME, manifest)
        f.write(b"\0" * (2 * _BLOCK))  # the end of the archive: two zero blocks
    ref = written[0][1]
    for (name, scan, label), size in zip(written, sizes, strict=True):
        members.append({"name": name, "path": scan.path, "role": scan.role, "rank": scan.rank, "label": label,
                        "bytes": size, "offset_ns": round((scan.offset_us - ref.offset_us) * 1000.0)})
    return {"out": out, "format": "perfetto", "files": len(written), "files_read": len(written),
            "base_time_us": ref.first_us, "errors": [e.file_dict() for e in errors], "salvaged": salvaged,
            "skipped": skipped, "scope": selection.to_dict(), "json_bytes": json_bytes, "members": members,
            "manifest": msgspec.json.decode(manifest), "warnings": _size_warning(out, json_bytes), "conflicts": []}


def _size_warning(out: str, json_bytes: int) -> list[str]:
    if json_bytes <= VIEWER_LIMIT_BYTES:
        return []
    return [f"{out} holds {json_bytes / 1e6:,.0f} MB of JSON, more than the Perfetto UI can be expected to hold in a "
            f"browser (about {VIEWER_LIMIT_BYTES / 1e6:.0f} MB: it keeps the whole archive in memory, then parses it, "
            "within about 2 GB); open it through the native trace processor (trace_processor server http "
            f"{out}, then https://ui.perfetto.dev), or merge fewer --ranks, --roles or --steps"]
