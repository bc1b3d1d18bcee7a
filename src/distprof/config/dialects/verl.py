"""verl: ``global_profiler`` (tool, steps, save_path, global_tool_config) plus a ``profiler`` section per role.

Rules (verl 0.5+, ``verl/trainer/config/ppo_trainer.yaml`` and ``profiler/profiler.yaml``):

- Roles, as verl names them: ``actor`` (``actor_rollout_ref.actor.profiler``), ``ref``, ``rollout`` and
  ``critic`` (``critic.profiler``). Each becomes a distprof role with its own ``per_role`` entry; only enabled
  roles are listed in ``roles``.
- ``global_profiler.steps`` are verl's global steps, which count from 1 (``trainer.global_steps``; step 0 never
  runs). They are kept as they are: build each role's Profiler with ``global_step=trainer.global_steps``.
  ``null`` profiles nothing.
- A role's ``tool`` defaults to ``global_profiler.tool``: torch -> torch, nsys -> nsys, torch_memory ->
  cuda_memory, memray -> memray. npu and precision_debugger have no distprof backend and are refused.
- ``all_ranks: true`` -> ranks all; ``ranks: [..]`` -> those ranks; neither -> rank 0 (verl's rule).
- ``tool_config.torch.contents`` (cuda, cpu, memory, shapes, stack): CPU activity always (verl records it either
  way); cuda when listed or when contents is empty; memory -> profile_memory; shapes -> record_shapes;
  stack -> with_stack. ``tool_config.torch.discrete`` -> discrete.
- ``global_tool_config.nsys.worker_nsight_options`` -> nsys.options (distprof sets capture-range and
  capture-range-end itself).
- Every key of these sections that verl's profiler config does not have (``verl/utils/profiler/config.py``), or
  distprof does not read, is listed as dropped (``unknown``), with a did-you-mean when one is close.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import MISSING
from distprof.config.dialects.translation import Builder

ROLES = {
    "actor": "actor_rollout_ref.actor.profiler",
    "ref": "actor_rollout_ref.ref.profiler",
    "rollout": "actor_rollout_ref.rollout.profiler",
    "critic": "critic.profiler",
}
TOOLS = {"torch": "torch", "nsys": "nsys", "torch_memory": "cuda_memory", "memray": "memray"}
NO_BACKEND = {
    "npu": "distprof has no Ascend NPU profiler (torch_npu.profiler); profile NPU jobs with verl itself, or use "
           "tool: torch on GPUs",
    "precision_debugger": "distprof has no precision debugger (msprobe); it profiles time and memory, not numerics",
}
CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack")
# The keys of verl's profiler sections (verl/utils/profiler/config.py); any other key is dropped as unknown.
_COMMON = ("_target_", "name")
PROFILER_KEYS = (*_COMMON, "tool", "enable", "all_ranks", "ranks", "save_path", "tool_config", "global_tool_config",
                 "relocate_results", "finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks", "discrete")
GLOBAL_KEYS = (*PROFILER_KEYS, "steps", "profile_continuous_steps")
TOOL_KEYS = {
    "torch": (*_COMMON, "contents", "discrete", "schedule", "profile_token_start", "profile_token_end", "step_start",
              "step_end"),
    "nsys": (*_COMMON, "discrete", "controller_nsight_options", "worker_nsight_options"),
    "npu": (*_COMMON, "contents", "level", "analysis", "discrete", "profile_token_start", "profile_token_end"),
    "torch_memory": (*_COMMON, "trace_alloc_max_entries", "stack_depth", "memory_snapshot_num_steps", "context",
                     "stacks", "kw_args"),
    "memray": (*_COMMON, "memory_snapshot_num_steps"),
    "precision_debugger": (*_COMMON, "config_path", "steps", "stages", "strict"),
}
DEFAULT_SAVE_PATH = "outputs/profile"  # verl's default global_profiler.save_path
G = "global_profiler"


def looks_like(data: Mapping[str, Any]) -> bool:
    return G in data or any(_get(data, p) is not None for p in ROLES.values())


def _get(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, Mapping):
            return None
        data = data.get(part)
    return data


def translate(b: Builder) -> None:
    if not isinstance(b.data, Mapping) or not looks_like(b.data):
        _not_verl(b)
        return
    _unknown(b, G, b.get(G, None), GLOBAL_KEYS, "global_profiler")
    tool = _tool_name(b, f"{G}.tool", b.get(f"{G}.tool", None))
    steps = _steps(b)
    save_path = b.get(f"{G}.save_path", DEFAULT_SAVE_PATH)
    save_path = DEFAULT_SAVE_PATH if save_path is None else b.as_path(f"{G}.save_path", save_path)
    _job_size(b)
    capturing, backends = _roles(b, tool)
    _enable_and_steps(b, steps, capturing)
    if save_path is not None:
        b.set("save_path", save_path, f"{G}.save_path",
              note="every role writes under it, in {save_path}/{role}/rank{R}/" if capturing else "")
    b.set("roles", capturing or None)
    if tool is not None:
        top = TOOLS.get(tool)
        if top is not None:
            b.set("backend", top, f"{G}.tool", tool, note="the default tool of every role")
    if "nsys" in backends:
        _nsys(b)
    if "cuda_memory" in backends:
        _torch_memory_global(b)
    _global_extras(b)


def _not_verl(b: Builder) -> None:
    """The error for a config without verl's profiler sections (verl's pre-0.5 layout named as such)."""
    if isinstance(b.data, Mapping) and b.get("trainer.profile_steps") is not MISSING:
        b.error("trainer.profile_steps", b.get("trainer.profile_steps"),
                "this is verl's pre-0.5 layout; move the steps to global_profiler.steps and set "
                "global_profiler.tool (nsys, torch, ...), then enable the roles' profiler sections")
        return
    b.error(G, MISSING, "no global_profiler section and no role profiler section (actor_rollout_ref.actor.profiler, "
                        "critic.profiler ...); give the trainer config (ppo_trainer.yaml), or --section for the "
                        "part that holds global_profiler")


def _roles(b: Builder, tool: str | None) -> tuple[list[str], set[str]]:
    """Each role's profiler section as its per_role entry: the roles that capture and their backends."""
    capturing: list[str] = []
    backends: set[str] = set()
    for role, path in ROLES.items():
        sec = b.get(path, None)
        if sec is None:
            continue
        if not isinstance(sec, Mapping):
            b.error(path, sec, "expected a mapping of profiler settings (enable, tool, all_ranks, ranks, tool_config)")
            continue
        _unknown(b, path, sec, PROFILER_KEYS, "profiler")
        backend = _role(b, role, path, sec, tool)
        if backend is not None:
            capturing.append(role)
            backends.add(backend)
    return capturing, backends


def _enable_and_steps(b: Builder, steps: list[int] | None, capturing: list[str]) -> None:
    if steps is None and capturing:
        b.captures_nothing(f"{G}.steps is {'empty' if b.get(f'{G}.steps', None) == [] else 'null'}, so verl profiles "
                           "no step")
        for role in capturing:  # a role enabled without steps would otherwise fall back to distprof's schedule
            b.config["per_role"][role]["enable"] = False
    elif not capturing and not b.errors:
        b.captures_nothing("no role's profiler is enabled with a tool (actor_rollout_ref.{actor,ref,rollout}.profiler, "
                           "critic.profiler: enable: true)")
    enable = bool(capturing) and steps is not None
    b.set("enable", enable)
    if steps is not None:
        note = ("verl's global steps count from 1 (trainer.global_steps); pass trainer.global_steps as the "
                "Profiler's global_step and the same steps are captured")
        if not b.get(f"{G}.profile_continuous_steps", False) and any(s + 1 in steps for s in steps):
            note += ("; verl writes one trace per listed step, distprof one per run of consecutive steps "
                     "(each step is still its ProfilerStep#N range)")
        b.set("steps", steps, f"{G}.steps", note=note)
    if b.get(f"{G}.profile_continuous_steps", False):
        b.note(f"{G}.profile_continuous_steps", True, "steps",
               "always so in distprof: consecutive steps form one window")


def _tool_name(b: Builder, source: str, tool: Any) -> str | None:
    """A tool setting: a name (or null); anything else (a list, a mapping) is one error naming ``source``."""
    if tool is None or isinstance(tool, str):
        return tool
    b.error(source, tool, f"expected one tool name: {', '.join(TOOLS)}")
    return None


def _unknown(b: Builder, path: str, sec: Any, keys: tuple[str, ...], what: str) -> None:
    """Drop, as unknown, each key of a verl profiler section (and of its tool_config / global_tool_config tool
    sections) that verl's config does not have."""
    if not isinstance(sec, Mapping):
        return
    b.unknown_keys(sec, path, keys, f"verl {what} key")
    for part in ("tool_config", "global_tool_config"):
        tools = sec.get(part)
        if part in keys and isinstance(tools, Mapping):
            b.unknown_keys(tools, f"{path}.{part}", TOOL_KEYS, f"verl {part} tool")
            for name, known in TOOL_KEYS.items():
                b.unknown_keys(tools.get(name), f"{path}.{part}.{name}", known, f"verl {part}.{name} key")


def _steps(b: Builder) -> list[int] | None:
    raw = b.get(f"{G}.steps", None)
    if raw is None:
        return None
    steps = b.as_int_list(f"{G}.steps", raw, minimum=0, what="verl global steps")
    if steps is None:
        return None
    if not steps:
        return None  # as null: verl profiles no step
    if 0 in steps:
        b.error(f"{G}.steps", raw, "verl counts global steps from 1, so step 0 never runs and would never be "
                                   "profiled; use 1 for the first training step")
        return None
    return sorted(set(steps))


def _job_size(b: Builder) -> None:
    b.job_size("trainer.total_training_steps", "trainer.nnodes", "trainer.n_gpus_per_node")


def _role(b: Builder, role: str, path: str, sec: Mapping[str, Any], global_tool: Any) -> str | None:
    """Write the role's per_role entry; return its distprof backend when it captures."""
    enable = b.as_bool(f"{path}.enable", sec.get("enable", False))
    if not enable:
        b.set(f"per_role.{role}.enable", False, f"{path}.enable", sec.get("enable", False),
              note=f"role {role} captures nothing")
        return None
    tool = sec.get("tool") if sec.get("tool") is not None else global_tool
    tool_src = f"{path}.tool" if sec.get("tool") is not None else f"{G}.tool"
    if tool is None:
        b.set(f"per_role.{role}.enable", False, f"{path}.enable", True,
              note=f"role {role} has no tool (its tool and {G}.tool are null), so verl profiles nothing for it")
        b.captures_nothing(f"{path} is enabled but neither it nor {G} names a tool")
        return None
    backend = _role_backend(b, role, path, tool, tool_src)
    # The role's other fields are read even when its tool is refused, so every error is reported at once.
    _role_ranks(b, role, path, sec)
    role_save = sec.get("save_path")
    global_save = b.get(f"{G}.save_path", DEFAULT_SAVE_PATH)
    if role_save is not None and role_save != global_save:
        b.drop(f"{path}.save_path", role_save, f"distprof writes every role under one save_path "
                                               f"({global_save!s}), in {{save_path}}/{role}/; set it there")
    _hooks(b, path, sec)
    if backend is None:
        return None
    tc = sec.get("tool_config") or {}
    if not isinstance(tc, Mapping):
        b.error(f"{path}.tool_config", tc, "expected a mapping of tool sections (torch, nsys, torch_memory ...)")
        return backend
    _tool_config(b, role, path, backend, tc)
    return backend


def _role_backend(b: Builder, role: str, path: str, tool: Any, tool_src: str) -> str | None:
    """The role's tool as a distprof backend (its enable and backend written), or None (refused: one error)."""
    backend = TOOLS.get(tool) if isinstance(tool, str) else None
    if not isinstance(tool, str):  # a list or mapping: the global one is refused once, where it is read
        if tool_src != f"{G}.tool":
            _tool_name(b, tool_src, tool)
    elif tool in NO_BACKEND:
        b.error(tool_src, tool, f"role {role}: {NO_BACKEND[tool]}")
    elif backend is None:
        close = difflib.get_close_matches(str(tool), [*TOOLS, *NO_BACKEND], n=1, cutoff=0.4)
        b.error(tool_src, tool, f"role {role}: unknown tool; {f'did you mean {close[0]!r}? ' if close else ''}use one "
                                f"of {', '.join(TOOLS)} (verl would silently profile nothing)")
    else:
        b.set(f"per_role.{role}.enable", True, f"{path}.enable", True)
        b.set(f"per_role.{role}.backend", backend, tool_src, tool)
    return backend


def _role_ranks(b: Builder, role: str, path: str, sec: Mapping[str, Any]) -> None:
    all_ranks = b.as_bool(f"{path}.all_ranks", sec.get("all_ranks", False))
    ranks_raw = sec.get("ranks") or []
    if all_ranks:
        b.set(f"per_role.{role}.ranks", "all", f"{path}.all_ranks", True)
        if ranks_raw:
            b.drop(f"{path}.ranks", ranks_raw, "all_ranks is true, so verl profiles every rank and ignores ranks")
    elif ranks_raw:
        ranks = b.as_int_list(f"{path}.ranks", ranks_raw, what="global ranks")
        if ranks:
            b.set(f"per_role.{role}.ranks", sorted(set(ranks)), f"{path}.ranks", ranks_raw)
    else:
        b.set(f"per_role.{role}.ranks", [0], f"{path}.ranks", sec.get("ranks", MISSING),
              note="verl profiles rank 0 when all_ranks is false and ranks is empty")


def _tool_config(b: Builder, role: str, path: str, backend: str, tc: Mapping[str, Any]) -> None:
    """The role's tool_config section of its backend's tool."""
    if backend == "torch":
        _torch(b, role, f"{path}.tool_config.torch", tc.get("torch") or {})
    elif backend == "nsys":
        nsys_tc = tc.get("nsys") or {}
        discrete = nsys_tc.get("discrete") if isinstance(nsys_tc, Mapping) else None
        if discrete is None:
            discrete = b.get(f"{G}.global_tool_config.nsys.discrete", False)
        if discrete:
            b.drop(f"{path}.tool_config.nsys.discrete", discrete,
                   "distprof's discrete mode needs an in-process backend (torch, cuda_memory); with nsys each "
                   "profiled step is one capture range (use tool: torch with discrete for per-stage traces)")
    elif backend == "cuda_memory":
        _torch_memory_role(b, role, f"{path}.tool_config.torch_memory", tc.get("torch_memory") or {})
    elif backend == "memray":
        mem = tc.get("memray") or {}
        n = mem.get("memory_snapshot_num_steps", 1) if isinstance(mem, Mapping) else 1
        if n not in (None, 1):
            b.drop(f"{path}.tool_config.memray.memory_snapshot_num_steps", n,
                   "distprof writes one memray capture per window of consecutive profiled steps")


def _torch(b: Builder, role: str, src: str, tc: Any) -> None:
    if not isinstance(tc, Mapping):
        b.error(src, tc, "expected a mapping (contents, discrete, schedule ...)")
        return
    contents_raw = tc.get("contents")
    contents = b.as_str_list(f"{src}.contents", contents_raw or [])
    if contents is not None:
        bad = [c for c in contents if c not in CONTENTS]
        if bad:
            b.error(f"{src}.contents", contents_raw, f"{', '.join(map(repr, bad))} not among verl's torch contents "
                                                     f"({', '.join(CONTENTS)})")
        elif not contents:
            if contents_raw is not None:
                b.note(f"{src}.contents", contents_raw, f"per_role.{role}.torch.activities",
                       "empty: verl records CPU and CUDA; distprof's default records CPU and the accelerator present")
        else:
            cuda = "cuda" in contents
            b.set(f"per_role.{role}.torch.activities", ["cpu", "cuda"] if cuda else ["cpu"], f"{src}.contents",
                  contents_raw, note="CPU activity is always recorded (verl's stage markers are CPU events)")
            for content, flag in (("memory", "profile_memory"), ("shapes", "record_shapes"), ("stack", "with_stack")):
                if content in contents:
                    b.set(f"per_role.{role}.torch.{flag}", True, f"{src}.contents", contents_raw,
                          note=f"'{content}' -> torch.{flag}")
    discrete = tc.get("discrete", False)
    if discrete:
        d = b.as_bool(f"{src}.discrete", discrete)
        if d:
            b.set(f"per_role.{role}.discrete", True, f"{src}.discrete", discrete,
                  note="each annotated stage of a profiled step is its own trace")
    sched = tc.get("schedule")
    if isinstance(sched, Mapping) and (sched.get("active") or 0) > 0:
        b.drop(f"{src}.schedule", sched, "verl's schedule sub-samples update mini-batches inside a step; distprof "
                                         "captures whole global steps. Profile mini-batches with a Profiler of their "
                                         "own (role actor/mini_batch, stepped per mini-batch)")
    for k in ("step_start", "step_end"):
        if tc.get(k, -1) not in (None, -1):
            b.drop(f"{src}.{k}", tc[k], "older verl's step_start/step_end pick update_policy mini-batches inside a "
                                        "step (later verl: schedule); distprof captures whole global steps: "
                                        "global_profiler.steps chooses them")
    for k in ("profile_token_start", "profile_token_end"):
        if tc.get(k) is not None:
            b.drop(f"{src}.{k}", tc.get(k), "a token window of the rollout engine's built-in profiler (vLLM/SGLang); "
                                            "distprof profiles whole steps of the role's process")


def _torch_memory_role(b: Builder, role: str, src: str, tc: Any) -> None:
    tc = tc if isinstance(tc, Mapping) else {}
    g = f"{G}.global_tool_config.torch_memory"
    entries = tc.get("trace_alloc_max_entries", b.get(f"{g}.trace_alloc_max_entries", None))
    if entries is not None:
        n = b.as_int(f"{src}.trace_alloc_max_entries", entries, minimum=1)
        if n is not None:
            b.set(f"per_role.{role}.cuda_memory.max_entries", n, f"{src}.trace_alloc_max_entries", entries)
    n_steps = tc.get("memory_snapshot_num_steps", b.get(f"{g}.memory_snapshot_num_steps", 1))
    if n_steps not in (None, 1):
        b.drop(f"{src}.memory_snapshot_num_steps", n_steps,
               "distprof dumps one snapshot at the end of each window of consecutive profiled steps")
    depth = tc.get("stack_depth", b.get(f"{g}.stack_depth", 32))
    if depth not in (None, 32):
        b.drop(f"{src}.stack_depth", depth, "torch's public memory-history API has no stack depth; distprof records "
                                            "full Python stacks")


def _torch_memory_global(b: Builder) -> None:
    g = f"{G}.global_tool_config.torch_memory"
    stacks = b.get(f"{g}.stacks", None)
    if stacks is not None:
        if stacks in ("python", "all"):
            b.set("cuda_memory.stacks", stacks, f"{g}.stacks")
        elif stacks == "cpp":
            b.set("cuda_memory.stacks", "all", f"{g}.stacks", stacks,
                  note="torch records C++ frames only together with Python ones ('all')")
        else:
            b.error(f"{g}.stacks", stacks, "expected python, cpp or all")
    context = b.get(f"{g}.context", "all")
    if context not in (None, "all"):
        b.drop(f"{g}.context", context, "distprof always records allocation and state contexts ('all')")
    kw = b.get(f"{g}.kw_args", None)
    if kw:
        b.drop(f"{g}.kw_args", kw, "extra _record_memory_history arguments are not passed through")


def _nsys(b: Builder) -> None:
    g = f"{G}.global_tool_config.nsys"
    worker = b.get(f"{g}.worker_nsight_options", None)
    if isinstance(worker, Mapping):
        for k, v in worker.items():
            src = f"{g}.worker_nsight_options.{k}"
            if k == "capture-range":
                b.note(src, v, "nsys.options", "distprof sets capture-range=cudaProfilerApi itself for step windows")
            elif k == "capture-range-end":
                if v is not None:
                    b.drop(src, v, "distprof sets capture-range-end=repeat:N itself (N = its windows) and finalizes "
                                   "the report when the worker exits; verl's repeat-shutdown:N would kill the worker")
            elif k in ("o", "output"):
                b.drop(src, v, "distprof names the report {save_path}/{role}/nsys-pid{PID}.nsys-rep")
            elif v is None:
                continue
            else:
                b.set(f"nsys.options.{k}", v, src)
    elif worker is not None:
        b.error(f"{g}.worker_nsight_options", worker, "expected a mapping of nsys options")
    controller = b.get(f"{g}.controller_nsight_options", None)
    if controller:
        b.drop(f"{g}.controller_nsight_options", controller,
               "distprof does not wrap verl's driver (TaskRunner) process in nsys; profile it with a Profiler of its "
               "own (role controller) if needed")


def _hooks(b: Builder, path: str, sec: Mapping[str, Any]) -> None:
    # A role inherits these from global_profiler (verl interpolates them); report only a role's own value.
    if sec.get("relocate_results") and not b.get(f"{G}.relocate_results", False):
        b.note(f"{path}.relocate_results", sec.get("relocate_results"), "save_path",
               "always so in distprof: every trace (nsys reports included) is written or collected under save_path")
    cmd = sec.get("finish_hook_cmd")
    if cmd and cmd != b.get(f"{G}.finish_hook_cmd", None):
        b.drop(f"{path}.finish_hook_cmd", cmd, "distprof runs no shell command after profiling; give save_path an "
                                              "fsspec URL (s3://..., gs://...) to upload, or run it after the job")


def _global_extras(b: Builder) -> None:
    if b.get(f"{G}.relocate_results", False):
        b.note(f"{G}.relocate_results", True, "save_path",
               "always so in distprof: every trace (nsys reports included) is written or collected under save_path")
    cmd = b.get(f"{G}.finish_hook_cmd", None)
    if cmd:
        b.drop(f"{G}.finish_hook_cmd", cmd, "distprof runs no shell command after profiling; give save_path an fsspec "
                                            "URL (s3://..., gs://...) to upload, or run it after the job")
    pd = b.get(f"{G}.global_tool_config.precision_debugger", None)
    if isinstance(pd, Mapping) and (pd.get("config_path") or pd.get("stages")):
        b.drop(f"{G}.global_tool_config.precision_debugger", pd, NO_BACKEND["precision_debugger"])
