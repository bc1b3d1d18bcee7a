"""torchtitan: the ``[profiling]`` section of its TOML job config (``profiler`` in newer, Python-built configs).

Rules (``torchtitan/tools/profiler.py``):

- Periodic capture: every ``profile_freq`` steps, ``profiler_active`` steps recorded after ``profiler_warmup``
  warm-up steps (``wait = profile_freq - warmup - active``), forever unless ``profiler_repeat``. torchtitan's
  first training step is step 1 and runs under schedule step 0, so distprof's schedule (on global steps) gets
  skip_first + 1: with ``global_step=train_state.step + 1`` (the step about to run) the same steps are recorded,
  e.g. step 10, 20, 30 with the defaults.
- Every rank writes (ranks: all); record_shapes on; CPU plus the accelerator present.
- ``save_traces_folder`` under ``job.dump_folder`` -> save_path.
- ``enable_memory_snapshot`` -> role ``memory`` with the cuda_memory backend: one snapshot every
  ``memory_snapshot_freq`` steps (default profile_freq), Python stacks, and one on OOM.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import MISSING
from distprof.config.dialects.translation import Builder

SECTIONS = ("profiling", "profiler")
DEFAULTS: dict[str, Any] = {"enable_profiling": False, "save_traces_folder": "profiling/traces", "profile_freq": 10,
                            "profiler_repeat": None, "profiler_skip_first": None, "profiler_skip_first_wait": None,
                            "profiler_active": 1, "profiler_warmup": 3, "enable_memory_snapshot": False,
                            "memory_snapshot_freq": None, "save_memory_snapshot_folder": "profiling/memory_snapshot",
                            "memory_snapshot_max_entries": 1_000_000, "trace_post_processor": None}
MEMORY_ROLE = "memory"


def looks_like(data: Mapping[str, Any]) -> bool:
    return any(isinstance(data.get(s), Mapping) and ("enable_profiling" in data[s] or "profile_freq" in data[s])
               for s in SECTIONS)


def translate(b: Builder) -> None:
    where, sec = "", MISSING
    for s in SECTIONS:
        if isinstance(b.get(s, None), Mapping):
            where, sec = s, b.get(s)
            break
    if sec is MISSING and isinstance(b.data, Mapping) and "enable_profiling" in b.data:
        sec = b.data
    if sec is MISSING:
        b.error("profiling", MISSING, "not found; torchtitan reads [profiling] (profiler in newer configs)")
        return

    v, src = b.section_fields(sec, where, DEFAULTS, "torchtitan profiling")
    dump = b.get("job.dump_folder", "./torchtitan/outputs")
    if dump is not None and b.as_path("job.dump_folder", dump) is None:
        dump = ""  # refused above; the folders below are still checked
    trace_on = b.as_bool(src("enable_profiling"), v["enable_profiling"])
    memory_on = b.as_bool(src("enable_memory_snapshot"), v["enable_memory_snapshot"])
    steps_total = b.get("training.steps", None)
    if steps_total is not None:
        n = b.as_int("training.steps", steps_total, minimum=1)
        if n is not None:
            b.last_step = ("training.steps", n)
    b.set("ranks", "all", src("enable_profiling"), v["enable_profiling"], note="torchtitan profiles every rank")
    if not trace_on and not memory_on:
        b.captures_nothing(f"{src('enable_profiling')} and {src('enable_memory_snapshot')} are false")
        b.set("enable", False)
        return
    b.set("enable", True)
    if trace_on:
        _trace(b, src, v, dump)
    if memory_on:
        _memory(b, src, v, dump, alone=not trace_on, given=set(sec))
    if v["trace_post_processor"]:
        b.drop(src("trace_post_processor"), v["trace_post_processor"], "distprof calls no hook after export")


def _join(b: Builder, source: str, dump: Any, folder: Any) -> str | None:
    folder = b.as_path(source, folder)
    if folder is None or (dump is not None and not isinstance(dump, str)):
        return None
    return posixpath.join(dump, folder) if dump else folder


def _trace(b: Builder, src, v: Mapping[str, Any], dump: Any) -> None:
    freq = b.as_int(src("profile_freq"), v["profile_freq"], minimum=1)
    warmup = b.as_int(src("profiler_warmup"), v["profiler_warmup"], minimum=0)
    active = b.as_int(src("profiler_active"), v["profiler_active"], minimum=1)
    if freq is None or warmup is None or active is None:
        return
    if freq < warmup + active:
        b.error(src("profile_freq"), freq, f"must be >= profiler_warmup + profiler_active ({warmup} + {active}); "
                                           "torchtitan refuses it too")
        return
    skip = 0
    if v["profiler_skip_first"] is not None:
        skip = b.as_int(src("profiler_skip_first"), v["profiler_skip_first"], minimum=0) or 0
    repeat = 0
    if v["profiler_repeat"] is not None:
        repeat = b.as_int(src("profiler_repeat"), v["profiler_repeat"], minimum=0) or 0
    wait = freq - warmup - active
    if v["profiler_skip_first_wait"]:
        if repeat == 1:
            wait = 0  # the only cycle skips its wait
        else:
            b.error(src("profiler_skip_first_wait"), v["profiler_skip_first_wait"],
                    "skipping only the first cycle's wait has no distprof schedule equivalent when cycles repeat; "
                    "drop it, or set profiler_skip_first instead")
            return
    sched = {"skip_first": skip + 1, "wait": wait, "warmup": warmup, "active": active, "repeat": repeat}
    b.set("backend", "torch", src("enable_profiling"), True)
    b.set("schedule", sched, f"{src('profile_freq')}, {src('profiler_warmup')}, {src('profiler_active')}",
          [freq, warmup, active], note=f"every {freq} steps, {'forever' if repeat == 0 else f'{repeat} times'}; "
                                       "skip_first + 1 as torchtitan's step 1 runs under schedule step 0: pass the "
                                       "step about to run as global_step")
    b.set("torch.record_shapes", True, src("enable_profiling"), True, note="torchtitan records shapes")
    path = _join(b, src("save_traces_folder"), dump, v["save_traces_folder"])
    if path is not None:
        b.set("save_path", path, src("save_traces_folder"), v["save_traces_folder"], note="under job.dump_folder")


def _memory(b: Builder, src, v: Mapping[str, Any], dump: Any, alone: bool, given: set) -> None:
    freq_raw = v["memory_snapshot_freq"] if v["memory_snapshot_freq"] is not None else v["profile_freq"]
    freq = b.as_int(src("memory_snapshot_freq"), freq_raw, minimum=1)
    entries = b.as_int(src("memory_snapshot_max_entries"), v["memory_snapshot_max_entries"], minimum=1)
    if freq is None or entries is None:
        return
    prefix = "" if alone else f"per_role.{MEMORY_ROLE}."
    b.set(f"{prefix}backend", "cuda_memory", src("enable_memory_snapshot"), True,
          note="" if alone else f"as role {MEMORY_ROLE!r}: build Profiler(config, role='memory') next to the trace one")
    b.set(f"{prefix}schedule", {"skip_first": 1, "wait": 0, "warmup": 0, "active": freq, "repeat": 0},
          src("memory_snapshot_freq"), freq_raw,
          note=f"a snapshot every {freq} steps (history restarts at each; torchtitan keeps one ring buffer)")
    b.set(f"{prefix}cuda_memory", {"stacks": "python", "max_entries": entries, "dump_on_oom": True},
          src("memory_snapshot_max_entries"), v["memory_snapshot_max_entries"],
          note="Python stacks, and a snapshot on OOM, as torchtitan")
    if alone:
        path = _join(b, src("save_memory_snapshot_folder"), dump, v["save_memory_snapshot_folder"])
        if path is not None:
            b.set("save_path", path, src("save_memory_snapshot_folder"), v["save_memory_snapshot_folder"],
                  note="under job.dump_folder")
    elif "save_memory_snapshot_folder" in given:
        b.drop(src("save_memory_snapshot_folder"), v["save_memory_snapshot_folder"],
               f"distprof writes every role under one save_path, in {{save_path}}/{MEMORY_ROLE}/")
