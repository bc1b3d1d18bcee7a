"""Every name and layout rule of a run directory, defined once.

    {save_path}/run.json
    {save_path}/{role}/role.json
    {save_path}/{role}/rank{R:05d}/step{A:08d}-{B:08d}{suffix}
    {save_path}/{role}/rank{R:05d}/step{A:08d}-{A:08d}.stage-{stage}{suffix}   (discrete mode: one per stage run)
    {save_path}/{role}/rank{R:05d}/manifest.jsonl
    {save_path}/{role}/rank{R:05d}/telemetry.jsonl, telemetry.1.jsonl         (telemetry: true; the older segment)
    {save_path}/{role}/rank{R:05d}/hang.json, hang-stacks.txt                  (hang: the rank's hang evidence)
    {save_path}/detections.jsonl                                               (detect: true; one line per detection)
    {save_path}/{role}/{backend}-pid{P}{ext}                                   (process backends: one per worker)
    {save_path}/{role}/{backend}-pid{P}.rank{R:05d}{ext}                       (the same under `distprof wrap`)
    {save_path}/driver/rank00000/step{A:08d}-{B:08d}.ray_timeline.json.gz      (Ray's task timeline of a window)

A file whose name starts with ``.tmp-{pid}-`` is a write in progress (or one that never finished).
When two processes claim one (role, rank), the second to publish a name keeps its file as
``step{A:08d}-{B:08d}.pid{P}{...}`` (see :func:`conflict_name`): nothing is ever overwritten.
Pure functions and constants: no I/O, no imports beyond the standard library.
"""

from __future__ import annotations

import posixpath
import re

from distprof.util.safetext import control_char

__all__ = [
    "COLLECT_JSON",
    "DETECTIONS",
    "DRIVER_ROLE",
    "HANG",
    "HANG_STACKS",
    "MANIFEST",
    "PROCESS_BACKENDS",
    "RANK_FILES",
    "RAY_TIMELINE",
    "ROLE_JSON",
    "RUN_FILES",
    "RUN_JSON",
    "TELEMETRY",
    "TELEMETRY_OLD",
    "TMP_PREFIX",
    "conflict_name",
    "control_char",
    "is_process_output",
    "is_ray_timeline",
    "is_url",
    "pid_of_temp",
    "process_output_name",
    "process_output_prefix",
    "rank_dir",
    "rank_of_dir",
    "rank_of_process_output",
    "ray_timeline_name",
    "sanitize_role",
    "stage_label",
    "stage_of_file",
    "temp_name",
    "window_file_name",
]

TMP_PREFIX = ".tmp-"
MANIFEST = "manifest.jsonl"
TELEMETRY = "telemetry.jsonl"  # a rank's step telemetry stream (distprof.capture.telemetry): the current segment
TELEMETRY_OLD = "telemetry.1.jsonl"  # the segment before it, kept when the stream rotates
HANG = "hang.json"  # a rank's hang evidence (distprof.capture.hang): collective history, step, phase, stacks
HANG_STACKS = "hang-stacks.txt"  # faulthandler's C watchdog's stack dumps (a rank stuck in C code with the GIL)
# a rank folder's own files: never traces, never "unlisted"
RANK_FILES = (MANIFEST, TELEMETRY, TELEMETRY_OLD, HANG, HANG_STACKS)
DETECTIONS = "detections.jsonl"  # the watcher's detections, one JSON line each, at the run directory's root
RUN_JSON = "run.json"
ROLE_JSON = "role.json"  # {role}/role.json: that role's world size and plan, for `distprof check`
# What the last distprof.integrations.ray.collect into this folder could not reach (for check).
COLLECT_JSON = "collect.json"
RUN_FILES = (RUN_JSON, ROLE_JSON, COLLECT_JSON, HANG)  # the run directory's own JSON files: never traces
# The process running an RL loop (distprof.integrations.ray.driver): its phases wait on the other roles.
DRIVER_ROLE = "driver"
# The manifest ``backend`` of a window's Ray task timeline (distprof.integrations.ray.timeline).
RAY_TIMELINE = "ray_timeline"
_RAY_TIMELINE_SUFFIX = ".ray_timeline.json.gz"
PROCESS_BACKENDS = ("nsys", "rocprof_sys", "py_spy", "memray")  # tools that wrap the whole worker process

_RANK_DIR = re.compile(r"^rank(\d{5})$")


def is_url(path: str) -> bool:
    """An fsspec URL (``s3://``, ``gs://``, ``memory://``); ``file://`` is a local path."""
    return "://" in path and not path.startswith("file://")


def sanitize_role(role: str) -> str:
    """Normalise a role given in code; refuse one that would leave the run directory."""
    if not isinstance(role, str) or not role.strip():
        raise ValueError(f"role must be a non-empty string, got {role!r}")
    bad = control_char(role)
    if bad is not None:  # Kineto's rename of the trace faults on them, and no folder name should hold them
        shown = repr(role[:80]) + ("..." if len(role) > 80 else "")
        raise ValueError(f"role {shown} contains the control character {bad!r}; use a printable name such as "
                         "'actor/micro_step'")
    parts = [p for p in role.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or role.startswith(("/", "~")) or ".." in parts:
        raise ValueError(f"role {role!r} would write outside save_path; use a relative name such as 'actor/micro_step'")
    return "/".join(parts)


def rank_dir(role: str, rank: int) -> str:
    """``actor/rank00003``: where one (role, rank) writes, relative to save_path."""
    return f"{role}/rank{rank:05d}"


def rank_of_dir(name: str) -> int | None:
    """The rank of a rank folder's name (``rank00003`` -> 3; its last path component), else None."""
    m = _RANK_DIR.match(posixpath.basename(name.rstrip("/")))
    return int(m.group(1)) if m else None


def window_file_name(start: int, end: int, suffix: str, label: str | None = None) -> str:
    """``step00000003-00000005.pt.trace.json.gz``; with a discrete stage's ``label`` (see :func:`stage_label`),
    ``step00000003-00000003.stage-rollout-generate.pt.trace.json.gz``."""
    return f"step{start:08d}-{end:08d}{'.' + label if label else ''}{suffix}"


_STAGE_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_STAGE_FILE = re.compile(r"^step\d{8}-\d{8}(?:\.pid\d+(?:-\d+)?)?\.stage-([A-Za-z0-9_-]+)\.")


def stage_label(stage: str, nth: int = 1) -> str:
    """A stage name as a file-name part: ``rollout/generate`` -> ``stage-rollout-generate``; the stage's ``nth`` run
    in one step (from 2) gets ``-2``, ``-3`` ... so every run keeps its own file."""
    slug = _STAGE_UNSAFE.sub("-", stage).strip("-")[:80] or "unnamed"
    return f"stage-{slug}" if nth == 1 else f"stage-{slug}-{nth}"


def stage_of_file(name: str) -> str | None:
    """The stage label in a discrete-mode file name (None for a window file)."""
    m = _STAGE_FILE.match(posixpath.basename(name))
    return m.group(1) if m else None


def temp_name(pid: int, name: str) -> str:
    """The hidden name ``name`` is written under by process ``pid`` before it is published (ends like it:
    torch gzips by suffix)."""
    return f"{TMP_PREFIX}{pid}-{name}"


def conflict_name(name: str, pid: int, nth: int = 1) -> str:
    """The name process ``pid`` publishes ``name`` under when another writer of the same (role, rank) already
    holds it: ``step00000003-00000005.pt.trace.json.gz`` -> ``step00000003-00000005.pid1234.pt.trace.json.gz``
    (the pid goes after the first component, so the suffix, and a stage label, still read the same). ``nth``
    from 2 (``.pid1234-2``): that name is taken too (one pid on two hosts or containers, or a re-run in one process)."""
    head, dot, rest = name.partition(".")
    return f"{head}.pid{pid}{'' if nth == 1 else f'-{nth}'}{dot}{rest}"


def pid_of_temp(name: str) -> int | None:
    """The writer's pid in a temporary's name (None for any other name)."""
    if not name.startswith(TMP_PREFIX):
        return None
    pid = name[len(TMP_PREFIX):].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def process_output_prefix(backend: str) -> str:
    """Process-backend outputs are named ``{backend}-pid{P}...`` in the role folder."""
    return f"{backend}-pid"


def is_process_output(name: str, backend: str) -> bool:
    return name.startswith(process_output_prefix(backend))


_PROCESS_RANK = re.compile(r"^[a-z_]+-pid\d+\.rank(\d{5,})(?:\.|$)")


def process_output_name(backend: str, pid: int, ext: str, rank: int | None = None) -> str:
    """``py_spy-pid1234.speedscope.json`` (a Ray worker's wrapper, pid 1234); with the rank a ``distprof wrap``
    knows, ``py_spy-pid1234.rank00003.speedscope.json``: the prefix is the same, so every reader of the first
    reads the second."""
    return f"{process_output_prefix(backend)}{pid}{'' if rank is None else f'.rank{rank:05d}'}{ext}"


def rank_of_process_output(name: str) -> int | None:
    """The rank in a process tool's output name (None where the name has none: the Ray path's)."""
    m = _PROCESS_RANK.match(posixpath.basename(name.rstrip("/")))
    return int(m.group(1)) if m else None


def ray_timeline_name(start: int, end: int) -> str:
    """``step00000003-00000005.ray_timeline.json.gz``: Ray's task timeline of a window (the driver's rank folder)."""
    return window_file_name(start, end, _RAY_TIMELINE_SUFFIX)


def is_ray_timeline(name: str) -> bool:
    """A Ray timeline file (not a trace: the analysis verbs skip it; ``check`` decodes it as JSON)."""
    return posixpath.basename(name).endswith(_RAY_TIMELINE_SUFFIX)
