"""SkyRL: ``trainer.policy.torch_profiler_config`` (RL) or a top-level ``torch_profiler_config`` (SFT).

Rules (``skyrl/train/config/config.py`` TorchProfilerConfig, ``skyrl/backends/skyrl_train/utils/profiler.py``):

- Policy workers only: the role is ``policy`` (SkyRL profiles no critic, ref, controller or inference engine).
- SkyRL's defaults apply to fields left out: ranks [0], skip_first 10, wait 0, warmup 1, active 1, repeat 1,
  activities [cpu, cuda], record_shapes and with_stack on.
- The schedule: SkyRL steps torch.profiler once per RL step from the first training step, which is global step 1
  (``trainer.global_step`` starts at 1). distprof evaluates schedules on global steps, so skip_first grows by 1:
  with ``global_step=trainer.global_step`` the same steps are recorded (and a resumed run records the steps a fresh
  one would, where SkyRL's would shift).
- export_type chrome_trace -> torch.export_chrome_trace; stacks -> torch.export_stacks with self CUDA time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import MISSING
from distprof.config.dialects.translation import Builder

SECTIONS = ("trainer.policy.torch_profiler_config", "torch_profiler_config")
DEFAULTS: dict[str, Any] = {"enable": False, "ranks": [0], "save_path": None, "skip_first": 10, "wait": 0, "warmup": 1,
                            "active": 1, "repeat": 1, "activities": ["cpu", "cuda"], "record_shapes": True,
                            "profile_memory": False, "with_stack": True, "with_flops": False, "with_modules": False,
                            "export_type": "chrome_trace"}
ROLE = "policy"


def looks_like(data: Mapping[str, Any]) -> bool:
    return any(_has(data, s) for s in SECTIONS)


def _has(data: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


def translate(b: Builder) -> None:
    found = _section(b)
    if found is None:
        return
    sec, where = found
    v, src = b.section_fields(sec, where, DEFAULTS, "SkyRL TorchProfilerConfig")
    enable = b.as_bool(src("enable"), v["enable"])
    b.set("enable", bool(enable), src("enable"), v["enable"])
    if not enable:
        b.captures_nothing(f"{src('enable')} is false")
    b.set("roles", [ROLE])
    b.note(where or "torch_profiler_config", "policy", "roles",
           "SkyRL profiles policy workers only (not critic, ref, controller or inference engines): role policy")
    _where(b, v, src, enable)
    _schedule(b, v, src)
    _torch(b, v, src, sec)
    _job(b)


def _section(b: Builder) -> tuple[Mapping[str, Any], str] | None:
    """The profiler section and its dotted place ("" for the section itself), or None (an error recorded)."""
    sec, where = MISSING, ""
    for s in SECTIONS:
        sec = b.get(s, MISSING)
        if sec is not MISSING:
            where = s
            break
    if sec is MISSING and isinstance(b.data, Mapping) and b.data and set(b.data) <= set(DEFAULTS):
        sec, where = b.data, ""  # the section itself (e.g. --section trainer.policy.torch_profiler_config)
    if sec is MISSING:
        b.error(SECTIONS[0], MISSING, "not found; SkyRL reads trainer.policy.torch_profiler_config (RL) or "
                                      "torch_profiler_config (SFT); give --section for another place")
        return None
    if not isinstance(sec, Mapping):
        b.error(where or "torch_profiler_config", sec, "expected a mapping of profiler settings")
        return None
    return sec, where


def _where(b: Builder, v: Mapping[str, Any], src: Any, enable: bool | None) -> None:
    """ranks and save_path."""
    ranks = b.as_int_list(src("ranks"), v["ranks"], what="global ranks")
    if ranks == []:
        b.error(src("ranks"), v["ranks"], "is empty; SkyRL requires at least one rank, e.g. [0]")
    elif ranks:
        b.set("ranks", sorted(set(ranks)), src("ranks"), v["ranks"])
    save = b.as_path(src("save_path"), v["save_path"]) if v["save_path"] else None
    if save:
        note = "SkyRL refuses cloud URIs; distprof writes them through fsspec" if "://" in save else ""
        b.set("save_path", save, src("save_path"), note=note)
    elif enable and not v["save_path"]:
        b.error(src("save_path"), v["save_path"], "required when enable is true: an absolute local path (or, with "
                                                  "distprof, an fsspec URL)")


def _schedule(b: Builder, v: Mapping[str, Any], src: Any) -> None:
    sched = {}
    for k in ("skip_first", "wait", "warmup", "active", "repeat"):
        n = b.as_int(src(k), v[k], minimum=1 if k == "active" else 0)
        if n is not None:
            sched[k] = n
    if len(sched) == 5:
        skyrl_skip = sched["skip_first"]
        sched["skip_first"] = skyrl_skip + 1
        b.set("schedule", sched, ", ".join(src(k) for k in ("skip_first", "wait", "warmup", "active", "repeat")),
              {k: v[k] for k in ("skip_first", "wait", "warmup", "active", "repeat")},
              note=f"skip_first {skyrl_skip} -> {skyrl_skip + 1}: SkyRL counts schedule steps from its first training "
                   "step, global step 1; pass trainer.global_step as the Profiler's global_step")


def _torch(b: Builder, v: Mapping[str, Any], src: Any, sec: Mapping[str, Any]) -> None:
    """activities, the torch.profiler flags and export_type."""
    acts = b.as_str_list(src("activities"), v["activities"])
    if acts is not None:
        bad = [a for a in acts if a.lower() not in ("cpu", "cuda")]
        if not acts:
            b.error(src("activities"), v["activities"], "is empty, so nothing would be recorded; use [cpu, cuda]")
        elif bad:
            b.error(src("activities"), v["activities"],
                    f"{', '.join(map(repr, bad))} not allowed; SkyRL takes cpu and cuda")
        else:
            b.set("torch.activities", [a.lower() for a in acts], src("activities"), v["activities"])
    for k in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
        flag = b.as_bool(src(k), v[k])
        if flag is not None:
            b.set(f"torch.{k}", flag, src(k), v[k], note="SkyRL's default" if k not in sec else "")
    export = v["export_type"]
    if export == "chrome_trace":
        b.set("torch.export_chrome_trace", True, src("export_type"), export)
    elif export == "stacks":
        if not v["with_stack"]:
            b.error(src("export_type"), export, "stacks needs with_stack: true (SkyRL refuses it without)")
        else:
            b.set("torch.export_stacks", True, src("export_type"), export,
                  note="one stacks file per window (SkyRL overwrote rank{N}_stacks.txt at each window)")
            b.set("torch.export_chrome_trace", False, src("export_type"), export)
            b.set("torch.stacks_metric", "self_cuda_time_total", src("export_type"), export)
    else:
        b.error(src("export_type"), export, "use chrome_trace or stacks")


def _job(b: Builder) -> None:
    b.job_size("trainer.max_training_steps", "trainer.placement.policy_num_nodes",
               "trainer.placement.policy_num_gpus_per_node")
