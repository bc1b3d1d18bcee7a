"""The manifest: one JSON line per closed window, in ``{role}/rank{R:05d}/manifest.jsonl``.

Written by the profiler (one ``write()`` on an ``O_APPEND`` file: a reader never sees half a line, except
after a crash of the storage itself) and read by ``check``, ``collect`` and the analysis. A manifest comes
from another job and may be cut or hand-edited: :func:`read_manifest` keeps every line of the right shape,
skips a torn or wrong-shaped one and says which, and never trusts a path it names (see
:func:`safe_relpath`).
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any

import msgspec

__all__ = [
    "BASELINE_STEPS",
    "EXPORT_BUDGET",
    "HANG",
    "LIMIT_STOPS",
    "MANIFEST_LIMIT",
    "OOM",
    "SETTLING_STEPS",
    "FileEntry",
    "ManifestRead",
    "WindowRecord",
    "encode_record",
    "read_manifest",
    "safe_relpath",
]

MANIFEST_LIMIT = 64 << 20  # bytes of a manifest read at most (a manifest is a few hundred bytes per window)

# What ``baseline_times_s`` holds (the profiler times them, the analysis explains them): at most BASELINE_STEPS
# unprofiled steps just before a window's warm-up, never one of the first SETTLING_STEPS steps the process's
# profiler ran (cuBLAS / cuDNN set-up, DDP bucket building, HF's first step) nor the step right after a window
# closed (it follows the export).
BASELINE_STEPS = 8
SETTLING_STEPS = 3
OOM = "oom"
"""``stopped_by`` of the line naming a CUDA out-of-memory snapshot (``backend: cuda_memory``)."""
EXPORT_BUDGET = "export_budget"
"""``stopped_by`` of a window closed early because closing it later was estimated to hold the training thread
over ``max_export_share`` of the collective timeout (capture/budget.py); ``guard`` holds the numbers."""
HANG = "hang"
"""``stopped_by`` of a window written as it stood when the hang watchdog found no step progress (capture/hang.py)."""
LIMIT_STOPS = {"memory_guard": "the memory guard", EXPORT_BUDGET: "the export budget"}
"""``stopped_by`` of a window a limit closed early (its numbers in ``guard``), and the limit's name in words."""

_Steps = Annotated[list[Annotated[int, msgspec.Meta(ge=0, lt=2**62)]], msgspec.Meta(min_length=2, max_length=2)]


class FileEntry(msgspec.Struct, frozen=True):
    """One published file of a window, relative to save_path (POSIX separators)."""
    path: str
    bytes: Annotated[int, msgspec.Meta(ge=0)]


class WindowRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One closed window. Field names are the manifest's JSON keys."""
    role: str
    rank: Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
    steps: _Steps
    """First and last global step recorded (a window cut short ends early)."""
    files: list[FileEntry] = []
    world_size: int
    complete: bool
    """False when the window closed before its planned end; ``stopped_by`` says why."""
    stopped_by: str | None = None
    """stop, exception, exit, a signal's name, step_end (discrete), memory_guard, export_budget, oom (a CUDA
    out-of-memory snapshot: its own line, steps from the window's first to the step the allocation failed in) ..."""
    start_time: float | None = None
    """Wall clock (s since the epoch) when the window opened (warm-up included)."""
    end_time: float | None = None
    """Wall clock when its last step ended."""
    written_time: float | None = None
    host: str | None = None
    pid: int | None = None
    backend: str
    torch: str | None = None
    stage: str | None = None
    """Discrete mode: the annotated stage this window holds."""
    trigger: str | None = None
    """On-demand capture: the id of the request (``distprof trigger``) that opened this window."""
    step_times_s: list[float] = []
    """Wall time of each recorded step, in order (profiling's own cost: compare with ``baseline_times_s``)."""
    baseline_times_s: list[float] = []
    """Wall time of up to ``BASELINE_STEPS`` steps that ran unprofiled on this rank just before the window's
    warm-up, in steady state (see ``SETTLING_STEPS``)."""
    baseline_step_numbers: list[Annotated[int, msgspec.Meta(ge=0, lt=2**62)]] = []
    """The global step of each ``baseline_times_s`` entry (absent in lines an older distprof wrote)."""
    first_step: Annotated[int, msgspec.Meta(ge=0, lt=2**62)] | None = None
    """The first step this process's profiler ran (its first ``SETTLING_STEPS`` steps are never a baseline)."""
    export_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """Wall time the training thread spent closing the window: torch's stop, export, gzip check and publication
    (with a held export, ``Profiler.export()`` too). Not part of any entry of ``step_times_s``."""
    guard: dict[str, Any] | None = None
    """``stopped_by: memory_guard`` or ``export_budget``: the numbers that crossed the limit (``limit``, what was
    ``measured``, its ``limit_value`` and more)."""
    local_path: str | None = None
    """The window's files stayed on ``host`` at this local folder: its upload to save_path failed."""
    upload_error: str | None = None
    """Why the upload failed (after retries); the files listed are at ``local_path``, not under save_path."""
    writer_conflict: bool = False
    """Another process already published this window's name for this (role, rank): both were kept, this one
    under a name carrying its pid (two writers claimed the same rank, e.g. rank detection fell back to 0)."""
    engine: dict[str, Any] | None = None
    """A rollout engine's trace (role ``{role}/engine``): ``engine`` (vllm, sglang), ``version``, ``replica``,
    ``ranks`` (from the engine's file name: vLLM ``rank``; SGLang ``tp``, ``dp``, ``pp``, ``ep``), ``files`` (the
    engine's own names); ``error`` when the engine failed and no file was taken."""
    annotations: dict[str, Any] = {}
    summary: dict[str, Any] | None = None
    # The first file again, for readers of the first manifest version (kept on write).
    file: str | None = None
    bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.files and self.file is not None and self.bytes is not None:
            self.files = [FileEntry(self.file, self.bytes)]  # a manifest line written before ``files`` existed

    @property
    def first(self) -> int:
        return self.steps[0]

    @property
    def last(self) -> int:
        return self.steps[1]


class ManifestRead(msgspec.Struct):
    records: list[WindowRecord]
    problems: list[str]
    """``line N: what is wrong`` for each line skipped."""


_decoder = msgspec.json.Decoder(WindowRecord)
_encoder = msgspec.json.Encoder()


def encode_record(record: WindowRecord) -> bytes:
    """One manifest line, newline included."""
    return _encoder.encode(record) + b"\n"


def read_manifest(data: bytes) -> ManifestRead:
    """Every well-formed record of a manifest's bytes; each torn or wrong-shaped line is skipped and named."""
    records, problems = [], []
    lines = data.splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(_decoder.decode(line))
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
            torn = i == len(lines) and not data.endswith(b"\n")
            problems.append(f"line {i}: {'torn (the writer stopped mid-line)' if torn else _short(e)}")
    return ManifestRead(records, problems)


def safe_relpath(path: Any, under: str = "") -> str | None:
    """``path`` if it names a file inside the run directory (relative, no ``..``, no NUL), normalised; else None.

    ``under``: the folder it must also stay inside (a rank folder's manifest names only that folder's files).
    """
    if not isinstance(path, str) or not path or "\x00" in path or "\\" in path or path.startswith("/"):
        return None
    norm = posixpath.normpath(path)
    if norm.startswith("..") or norm == ".":
        return None
    if under and not norm.startswith(under.rstrip("/") + "/"):
        return None
    return norm


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) <= 200 else text[:197] + "..."
