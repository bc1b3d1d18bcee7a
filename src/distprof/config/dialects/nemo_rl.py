"""NeMo-RL: the ``NRL_NSYS_*`` environment variables (its only profiler configuration).

The variables come from the config mapping (top-level keys, or an ``env`` / ``env_vars`` mapping, e.g. a Ray
``runtime_env``), then from the environment, which wins. A NeMo-RL YAML may be given too, for the job's length
(``grpo.max_num_steps``, ``sft.max_num_steps`` ...).

Rules (``nemo_rl/utils/nsys.py``, ``nemo_rl/distributed/worker_group_utils.py``):

- ``NRL_NSYS_WORKER_PATTERNS``: comma-separated fnmatch patterns of worker names (``dtensor_policy_worker*``,
  ``vllm_generation_worker*`` ...), kept as distprof roles (roles take globs).
- ``NRL_NSYS_PROFILE_STEP_RANGE=start:stop``: NeMo-RL's steps count from 1 and the range is stop-exclusive, so it
  becomes steps ``range(start, stop)``; pass NeMo-RL's step (``total_steps + 1``) as global_step. Both variables
  must be set together.
- ``save_path`` (a key of the mapping): where distprof collects the reports (NeMo-RL leaves them on each node).
- Backend nsys on every rank of a matching worker, with NeMo-RL's defaults (``t: cuda,nvtx``, ``s: none``,
  ``stop-on-exit: true``, ``capture-range: cudaProfilerApi``, ``capture-range-end: stop``,
  ``cuda-graph-trace: node``) and ``NRL_NSYS_EXTRA_OPTIONS`` (a JSON object) over them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import MISSING
from distprof.config.dialects.translation import Builder
from distprof.config.limits import MAX_ROLES

PATTERNS, RANGE, EXTRA = "NRL_NSYS_WORKER_PATTERNS", "NRL_NSYS_PROFILE_STEP_RANGE", "NRL_NSYS_EXTRA_OPTIONS"
DEFAULT_OPTIONS = {"t": "cuda,nvtx", "stop-on-exit": "true", "s": "none", "capture-range": "cudaProfilerApi",
                   "capture-range-end": "stop", "cuda-graph-trace": "node"}
ALGORITHMS = ("grpo", "sft", "dpo", "rm", "ppo", "distillation")


def looks_like(data: Mapping[str, Any]) -> bool:
    return any(str(k).startswith("NRL_NSYS_") for k in _file_env(data))


def _file_env(data: Any) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        return {}
    out = {k: v for k, v in data.items() if isinstance(k, str) and k.startswith("NRL_")}
    for key in ("env", "env_vars"):
        sub = data.get(key)
        if isinstance(sub, Mapping):
            out.update({k: v for k, v in sub.items() if isinstance(k, str) and k.startswith("NRL_")})
    return out


def translate(b: Builder) -> None:
    if not isinstance(b.data, Mapping):
        b.error("config", b.data, "expected a mapping of NRL_NSYS_* variables (or a NeMo-RL YAML with env: {...})")
        return
    env: dict[str, tuple[str, Any]] = {k: (k, v) for k, v in _file_env(b.data).items()}
    env.update({k: (f"env {k}", v) for k, v in b.env.items() if k.startswith("NRL_NSYS_")})
    for k in env:
        if k.startswith("NRL_NSYS_") and k not in (PATTERNS, RANGE, EXTRA):
            b.error(env[k][0], env[k][1], f"not a NeMo-RL variable; use {PATTERNS}, {RANGE}, {EXTRA}")
    _job(b)
    pat_src, pat = env.get(PATTERNS, (PATTERNS, ""))
    rng_src, rng = env.get(RANGE, (RANGE, ""))
    if not pat and not rng:
        b.captures_nothing(f"{PATTERNS} and {RANGE} are not set")
        b.set("enable", False)
        return
    if bool(pat) != bool(rng):
        missing = RANGE if pat else PATTERNS
        b.error(missing, MISSING, f"NeMo-RL needs {PATTERNS} and {RANGE} set together; set {missing} too")
        return
    if not isinstance(pat, str):  # a list or mapping would be read through its repr
        b.error(pat_src, pat, "expected comma-separated worker name patterns in one string, e.g. "
                              "'dtensor_policy_worker*,vllm_generation_worker*'")
        return
    patterns = [p.strip() for p in pat.split(",") if p.strip()]
    if len(patterns) > MAX_ROLES:  # each name is matched against every pattern: refused before
        b.error(pat_src, pat, f"holds {len(patterns):,} patterns, more than the {MAX_ROLES} roles a config may "
                              "have; cover the workers with a few globs such as '*policy*'")
        return
    b.set("enable", True)
    b.set("backend", "nsys", pat_src, pat)
    b.set("roles", patterns, pat_src, pat, note="fnmatch patterns of NeMo-RL worker names, kept as role globs")
    b.set("ranks", "all", pat_src, pat, note="every rank of a matching worker group")
    _range(b, rng_src, rng)
    _options(b, *env.get(EXTRA, (EXTRA, "")))
    save_src = "distprof.save_path" if b.get("distprof.save_path", None) else "save_path"
    save = b.get(save_src, None)
    if save:
        path = b.as_path(save_src, save)
        if path is not None:
            b.set("save_path", path, save_src)
    else:
        b.error("save_path", MISSING, "NeMo-RL leaves reports in /tmp/ray/session*/logs/nsight on each node; distprof "
                                      "collects them into save_path: add save_path: DIR to this file (or pass it "
                                      "to ProfilerConfig)")


def _range(b: Builder, src: str, raw: Any) -> None:
    text = str(raw)
    start_s, sep, stop_s = text.partition(":")
    try:
        if len(start_s.strip()) > 18 or len(stop_s.strip()) > 18:
            raise ValueError
        start, stop = int(start_s), int(stop_s)
    except ValueError:
        b.error(src, raw, "expected start:stop with whole numbers, e.g. 3:5")
        return
    if not sep:
        b.error(src, raw, "expected start:stop, e.g. 3:5")
    elif start < 1:
        b.error(src, raw, "NeMo-RL counts steps from 1; the start must be >= 1")
    elif stop <= start:
        b.error(src, raw, "the range is empty (stop is exclusive); use e.g. 3:5 for steps 3 and 4")
    else:
        steps = b.as_range(src, raw, start, stop)
        if steps is not None:
            b.set("steps", steps, src, raw,
                  note="NeMo-RL steps count from 1 and the stop is exclusive; pass NeMo-RL's step as global_step")


def _options(b: Builder, src: str, raw: Any) -> None:
    extra: Any = {}
    if raw not in ("", None):
        if isinstance(raw, Mapping):
            extra = dict(raw)
        else:
            try:
                extra = json.loads(str(raw))
            except json.JSONDecodeError as e:
                b.error(src, raw, f"not valid JSON ({e.msg}); write a JSON object such as "
                                  '{"cuda-memory-usage": "true"}')
                return
            if not isinstance(extra, dict):
                b.error(src, raw, "must be a JSON object of nsys option name to value")
                return
    opts = {**DEFAULT_OPTIONS, **extra}
    for k, v in opts.items():
        s = src if k in extra else "NeMo-RL default"
        if k in ("o", "output"):
            b.drop(f"{src}.{k}", v,
                   "distprof names each report {save_path}/{role}/nsys-pid{PID}.nsys-rep")
            continue
        if isinstance(v, (dict, list)) or v is None:
            b.error(f"{src}.{k}", v, "must be a single value (a string, number or true/false)")
            continue
        b.set(f"nsys.options.{k}", v, s, v)
    if "o" not in extra and "output" not in extra:
        b.drop("NeMo-RL default o", "'{worker}_{range}_%p'",
               "distprof names each report {save_path}/{role}/nsys-pid{PID}.nsys-rep")


def _job(b: Builder) -> None:
    for algo in ALGORITHMS:
        n = b.get(f"{algo}.max_num_steps", None)
        if n is not None:
            m = b.as_int(f"{algo}.max_num_steps", n, minimum=1)
            if m is not None:
                b.last_step = (f"{algo}.max_num_steps", m)  # steps 1..max_num_steps
            return
