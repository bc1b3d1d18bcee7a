"""RLinf: ``cluster.profiling`` (backend, enabled, worker_groups, steps, output_dir, options, flags / args, env).

Rules (``rlinf/scheduler/hardware/accelerators/{accelerator,nvidia_gpu,amd_gpu}.py``, docs guides/profile.rst):

- ``backend``: nsight -> nsys (``options``, ``flags``); rocprof_sys -> rocprof_sys (``args`` or ``options``,
  ``env``). Required.
- ``worker_groups`` become distprof roles under RLinf's group names (ActorGroup, RolloutGroup, EnvGroup, and
  the channel groups Actor, Rollout, Env); ``all`` selects every role; null profiles nothing. RLinf compares
  names case-insensitively, distprof exactly: write them as the groups are named.
- Every rank of a matching group is profiled (ranks: all).
- ``steps`` are the runner's global steps, counted from 0 (``runner.global_step``); null profiles the worker's
  whole lifetime.
- ``output_dir`` -> save_path; unset, RLinf's ``<runner.logger.log_path>/<experiment_name>/profiling``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import MISSING
from distprof.config.dialects.translation import Builder
from distprof.config.errors import suggest
from distprof.config.plan import steps_to_windows
from distprof.config.process_tools import nsys_capture_options

BACKENDS = {"nsight": "nsys", "rocprof_sys": "rocprof_sys"}
P = "cluster.profiling"
KNOWN = ("backend", "enabled", "worker_groups", "steps", "output_dir", "options", "flags", "args", "env")


def looks_like(data: Mapping[str, Any]) -> bool:
    cluster = data.get("cluster")
    return (isinstance(cluster, Mapping) and "profiling" in cluster) or ("worker_groups" in data and "backend" in data)


def translate(b: Builder) -> None:
    data = b.data
    prefix = P
    sec = b.get(P, MISSING)
    if sec is MISSING and isinstance(data, Mapping) and ("worker_groups" in data or "backend" in data):
        sec, prefix = data, ""  # the profiling section itself, e.g. a preset such as profile/default.yaml
    if sec is MISSING or sec is None:
        b.error(P, MISSING, "not found; RLinf reads profiling from cluster.profiling. If it comes from Hydra "
                            "defaults (profile/default@cluster.profiling), validate the composed config "
                            "(python main.py ... --cfg job > composed.yaml) or the preset file itself")
        return
    if not isinstance(sec, Mapping):
        b.error(P, sec, "expected a mapping (backend, enabled, worker_groups, steps, output_dir, options, flags)")
        return

    def src(k: str) -> str:
        return f"{prefix}.{k}" if prefix else k

    for k in sec:
        if k not in KNOWN:
            tip = suggest(k, KNOWN) or f"fields: {', '.join(KNOWN)}"
            b.error(src(str(k)), sec[k], f"not an RLinf profiling field; {tip}")

    raw_backend = sec.get("backend")
    backend = BACKENDS.get(str(raw_backend).lower()) if raw_backend else None
    if raw_backend in (None, ""):
        b.error(src("backend"), raw_backend, "required: nsight (NVIDIA Nsight Systems) or rocprof_sys (AMD)")
    elif backend is None:
        b.error(src("backend"), raw_backend, "unknown; use nsight or rocprof_sys")
    else:
        b.set("backend", backend, src("backend"), raw_backend)

    enabled = b.as_bool(src("enabled"), sec.get("enabled", True))
    groups = _groups(b, src("worker_groups"), sec.get("worker_groups"))
    steps = _steps(b, src("steps"), sec.get("steps"))
    last = b.get("runner.max_steps", None)
    if last is not None:
        n = b.as_int("runner.max_steps", last, minimum=1)
        if n is not None:
            b.last_step = ("runner.max_steps", n - 1)  # global steps 0 .. max_steps-1

    capture = bool(enabled) and groups != []
    if enabled is False:
        b.captures_nothing(f"{src('enabled')} is false")
    elif groups == []:
        b.captures_nothing(f"{src('worker_groups')} is null, and RLinf profiles no worker group then")
    b.set("enable", capture, src("enabled"), sec.get("enabled", True))
    if groups:
        b.set("roles", groups, src("worker_groups"), sec.get("worker_groups"),
              note="RLinf's worker group names become roles; RLinf matches them ignoring case, distprof exactly")
    elif groups is None:
        b.note(src("worker_groups"), "all", "roles", "every worker group")
    b.set("ranks", "all", src("worker_groups"), sec.get("worker_groups"),
          note="RLinf profiles every rank of a matching group")
    if steps is not None:
        b.set("steps", steps, src("steps"), note="the runner's global steps, counted from 0 (runner.global_step)")
    else:
        b.note(src("steps"), None, "steps", "null: the whole lifetime of each profiled worker")
    _output_dir(b, src("output_dir"), sec.get("output_dir"))
    if backend == "nsys":
        _nsight(b, src, sec, steps)
    elif backend == "rocprof_sys":
        _rocprof(b, src, sec)


def _groups(b: Builder, source: str, raw: Any) -> list[str] | None:
    """The role list; [] when nothing is profiled, None for every group."""
    if raw is None:
        return []
    names = b.as_str_list(source, raw)
    if names is None:
        return []
    if any(n.lower() == "all" for n in names):
        return None
    return names


def _steps(b: Builder, source: str, raw: Any) -> list[int] | None:
    if raw is None:
        return None
    steps = b.as_int_list(source, raw, what="global steps")
    if steps == []:
        b.error(source, raw,
                "is empty, so no step would be profiled; list steps such as [3], or null for the whole run")
        return None
    return sorted(set(steps)) if steps else None


def _output_dir(b: Builder, source: str, raw: Any) -> None:
    if raw:
        path = b.as_path(source, raw)
        if path is not None:
            b.set("save_path", path, source)
        return
    log_path, exp = b.get("runner.logger.log_path", None), b.get("runner.logger.experiment_name", None)
    if log_path and exp:
        if b.as_path("runner.logger.log_path", log_path) is None or b.as_path("runner.logger.experiment_name",
                                                                              exp) is None:
            return
        path = f"{str(log_path).rstrip('/')}/{exp}/profiling"
        b.set("save_path", path, "runner.logger.log_path, runner.logger.experiment_name", [log_path, exp],
              note="RLinf's default output_dir")
    else:
        b.error(source, raw, "not set, and runner.logger.log_path / experiment_name are not in this config; set "
                             "output_dir (RLinf would fall back to a temporary directory)")


def _options(b: Builder, source: str, raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        b.error(source, raw, "expected a mapping of option name to value, e.g. {t: cuda,nvtx}")
        return None
    return {str(k): ("true" if v is True else "false" if v is False else v) for k, v in raw.items()}


def _nsight(b: Builder, src, sec: Mapping[str, Any], steps: list[int] | None) -> None:
    opts = _options(b, src("options"), sec.get("options"))
    flags_raw = sec.get("flags")
    flags = b.as_str_list(src("flags"), flags_raw) if flags_raw not in (None, []) else []
    if opts is None or flags is None:
        return
    if "stop-on-range-end" in opts:
        if "capture-range-end" in opts:
            b.error(src("options"), opts,
                    "sets both stop-on-range-end and capture-range-end; keep one (RLinf refuses both)")
            return
        v = str(opts.pop("stop-on-range-end")).strip().lower()
        opts["capture-range-end"] = "stop" if v in ("true", "1", "yes", "on") else "none" if v in (
            "false", "0", "no", "off") else v
        b.note(src("options.stop-on-range-end"), v, "nsys.options.capture-range-end", "RLinf's alias")
    if "o" in opts and "output" in opts:
        b.error(src("options"), opts, "sets both o and output; keep one (RLinf refuses both)")
        return
    dup = sorted({f.lstrip("-") for f in flags} & set(opts))
    if dup:
        b.error(src("flags"), flags_raw, f"{', '.join(dup)} also set in options; RLinf refuses a name in both")
        return
    out = {}
    for k, v in opts.items():
        s = src(f"options.{k}")
        if k in ("o", "output"):
            b.drop(s, v, "distprof names each report {save_path}/{role}/nsys-pid{PID}.nsys-rep")
        elif k == "capture-range-end" and steps is not None:
            try:
                nsys_capture_options({"capture-range-end": v}, len(_windows(steps)), False)
            except ValueError as e:
                b.error(s, v, f"{e} (RLinf would capture only the first listed step)")
                continue
            out[k] = v
            b.set(f"nsys.options.{k}", v, s)
        else:
            out[k] = v
            b.set(f"nsys.options.{k}", v, s)
    if not opts:
        b.set("nsys.options", {}, src("options"), sec.get("options"),
              note="no options: nsys's own defaults")
    if steps is not None and "capture-range-end" not in opts:
        b.note(src("options"), sec.get("options"), "nsys.options.capture-range-end",
               "with steps RLinf adds capture-range-end=stop, which records only the first listed step; distprof "
               "adds repeat:N and records every listed step")
    if flags:
        b.set("nsys.flags", [f.lstrip("-") for f in flags], src("flags"), flags_raw)


def _rocprof(b: Builder, src, sec: Mapping[str, Any]) -> None:
    key = "args" if "args" in sec else "options"
    opts = _options(b, src(key), sec.get(key))
    if opts:
        b.set("rocprof_sys.options", opts, src(key), sec.get(key),
              note="one-letter keys render as -k v, longer ones as --key=v (as RLinf renders them)")
    env = sec.get("env")
    if env:
        if isinstance(env, Mapping):
            b.set("rocprof_sys.env", {str(k): str(v) for k, v in env.items()}, src("env"), env,
                  note="added to each profiled worker's environment, over distprof's ROCPROFSYS_OUTPUT_* "
                       "(set those only to override where reports go)")
        else:
            b.error(src("env"), env, "expected a mapping of variable name to value")


def _windows(steps: list[int]) -> list[Any]:
    return steps_to_windows(steps)
