"""slime: Megatron-style flags (``--use-pytorch-profiler --profile-step-start 10 ...``) and ``SLIME_PROFILE_*``.

The config is an argparse Namespace, a mapping (argparse dests such as ``profile_step_start`` or flag names such
as ``--profile-step-start``), or the launch script's arguments (a list of tokens or one string); every other
slime / Megatron flag is ignored.

Rules (``slime/observability/profile_utils.py``; the environment variables are those of slime PR #2397):

- Steps are rollout ids, counted from 0. slime's schedule records rollouts ``profile_step_start`` ..
  ``profile_step_end - 1`` (the end is exclusive) and warms up on the one before: distprof steps
  ``range(start, end)``; pass the rollout id as ``global_step`` (a resumed run then records the same rollouts,
  where slime's schedule, counted from process start, would shift).
- Roles are slime's profile targets: ``train_overall`` (stepped once per rollout), ``train_actor`` and
  ``train_log_probs``. The memory recorder is the role ``train_overall/memory``.
- Ranks: slime profiles every rank; ``--profile-ranks`` (Megatron's flag, which slime ignores) and
  ``SLIME_PROFILE_ALL_RANKS`` (0: rank 0 only) are honoured.
- slime hard-codes record_shapes, with_stack, profile_memory and with_flops on; each ``SLIME_PROFILE_RECORD_SHAPES``
  / ``_WITH_STACK`` / ``_MEMORY`` / ``_WITH_FLOPS`` variable sets its flag. Activities: CPU and the accelerator.
- Traces go to ``--tensorboard-dir`` (save_path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import MISSING, normalize_keys, parse_flags
from distprof.config.dialects.translation import Builder

SPEC: dict[str, dict[str, Any]] = {
    "use_pytorch_profiler": {"action": "store_true"},
    "profile_step_start": {"type": int},
    "profile_step_end": {"type": int},
    "profile_target": {"nargs": "+"},
    "profile_ranks": {"nargs": "+", "type": int},
    "record_memory_history": {"action": "store_true"},
    "memory_snapshot_dir": {},
    "memory_snapshot_path": {},
    "memory_snapshot_num_steps": {"type": int},
    "memory_recorder": {},
    "tensorboard_dir": {},
    "num_rollout": {"type": int},
    "profile": {"action": "store_true", "flags": ["--profile"]},
    "pytorch_profiler_collect_shapes": {"action": "store_true"},
    "pytorch_profiler_collect_callstack": {"action": "store_true"},
    "pytorch_profiler_collect_chakra": {"action": "store_true"},
}
DEFAULTS: dict[str, Any] = {"use_pytorch_profiler": False, "profile_step_start": 10, "profile_step_end": 12,
                            "profile_target": ["train_overall"], "profile_ranks": [], "record_memory_history": False,
                            "memory_snapshot_dir": ".", "memory_snapshot_path": "snapshot.pickle",
                            "memory_snapshot_num_steps": None, "memory_recorder": "torch", "tensorboard_dir": None,
                            "num_rollout": None}
TARGETS = ("train_overall", "train_actor", "train_log_probs")
ENV_FLAGS = {"SLIME_PROFILE_RECORD_SHAPES": "record_shapes", "SLIME_PROFILE_WITH_STACK": "with_stack",
             "SLIME_PROFILE_MEMORY": "profile_memory", "SLIME_PROFILE_WITH_FLOPS": "with_flops"}
ENV_ALL_RANKS = "SLIME_PROFILE_ALL_RANKS"
# Flags named like the profiler's: one that is not in SPEC is listed as unknown (every other slime flag is not ours).
PROFILER_FLAGS = ("--profile", "--use-pytorch-profiler", "--pytorch-profiler", "--record-memory", "--memory-snapshot",
                  "--memory-recorder")
MEMORY_ROLE = "train_overall/memory"


def looks_like(data: Mapping[str, Any]) -> bool:
    keys = set(normalize_keys(data))
    return bool(keys & {"use_pytorch_profiler", "profile_target", "record_memory_history"})


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _args(b: Builder) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """slime's arguments (dest -> value) and the SLIME_PROFILE_* variables (name -> (source, value)): the
    config's, then the environment's, which win."""
    data = b.data
    env: dict[str, tuple[str, str]] = {}
    rest: dict[str, Any] = {}  # the other flags: those named like the profiler's are listed as unknown
    if isinstance(data, (list, tuple, str)):
        try:
            args = parse_flags(data, SPEC, rest)
        except ValueError as e:
            b.error("arguments", MISSING, str(e))
            args = {}
    elif isinstance(data, Mapping):
        args = {}
        for k, v in normalize_keys(data).items():
            if k.startswith("SLIME_"):
                env[k] = (k, str(v))
            elif k in SPEC:
                args[k] = v
            else:
                rest[flag(k)] = v
    else:
        b.error("arguments", data, "expected slime's arguments: a mapping, an argparse Namespace or a list of flags")
        args = {}
    env.update({k: (f"env {k}", v) for k, v in b.env.items() if k.startswith("SLIME_PROFILE_")})
    b.unknown_keys({k: v for k, v in rest.items() if k.startswith(PROFILER_FLAGS)}, "",
                   [flag(k) for k in SPEC], "slime/Megatron profiler flag")
    b.unknown_keys({k: raw for k, (_, raw) in env.items() if k.startswith("SLIME_PROFILE_")}, "",
                   [*ENV_FLAGS, ENV_ALL_RANKS], "SLIME_PROFILE_* variable", source=lambda k: env[k][0])
    return args, env


def translate(b: Builder) -> None:
    args, env = _args(b)
    a = {**DEFAULTS, **{k: v for k, v in args.items() if v is not None or DEFAULTS.get(k) is None}}

    def given(k: str) -> bool:
        return k in args

    torch_on = b.as_bool(flag("use_pytorch_profiler"), a["use_pytorch_profiler"])
    memory_on = b.as_bool(flag("record_memory_history"), a["record_memory_history"])
    targets = _targets(b, a)
    roles: list[str] = []
    if torch_on:
        roles += targets
        _torch(b, a, env, targets)
    if memory_on and "train_overall" in targets:
        roles.append(MEMORY_ROLE)
        _memory(b, a, given, save_path_set=bool(torch_on))
    elif memory_on:
        b.drop(flag("record_memory_history"), True, "slime records memory history only with the train_overall target")
    _ranks(b, a, given, env)
    _ignored(b, args)
    if a["num_rollout"] is not None:
        n = b.as_int(flag("num_rollout"), a["num_rollout"], minimum=1)
        if n is not None:
            b.last_step = (flag("num_rollout"), n - 1)
    if not roles and not b.errors:
        b.captures_nothing("neither --use-pytorch-profiler nor --record-memory-history is set")
    b.set("enable", bool(roles))
    b.set("roles", roles or None)


def _targets(b: Builder, a: Mapping[str, Any]) -> list[str]:
    """--profile-target's names that are slime targets (the others are one error)."""
    targets = b.as_str_list(flag("profile_target"), a["profile_target"]) or []
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        b.error(flag("profile_target"), a["profile_target"], f"{', '.join(map(repr, bad))} not a slime target; use "
                                                              f"{', '.join(TARGETS)}")
    return [t for t in targets if t in TARGETS]


def _torch(b: Builder, a: Mapping[str, Any], env: Mapping[str, tuple[str, str]], targets: list[str]) -> None:
    """--use-pytorch-profiler: the rollouts recorded, torch's flags, the targets' notes, --tensorboard-dir."""
    start = b.as_int(flag("profile_step_start"), a["profile_step_start"], minimum=0, what="a rollout id")
    end = b.as_int(flag("profile_step_end"), a["profile_step_end"], minimum=0, what="a rollout id")
    if start is not None and end is not None:
        if end <= start:
            b.error(flag("profile_step_end"), end, f"must be greater than --profile-step-start ({start}): slime "
                                                   "records rollouts start .. end-1")
        else:
            src = f"{flag('profile_step_start')}, {flag('profile_step_end')}"
            steps = b.as_range(src, [start, end], start, end)
            if steps is not None:
                b.set("steps", steps, src, [start, end],
                      note="rollout ids from 0; the end is exclusive; pass the rollout id as global_step")
    _torch_flags(b, env)
    for t in targets:
        if t != "train_overall":
            b.note(flag("profile_target"), t, f"roles: {t}",
                   "slime has no caller for this target since its FSDP backend was removed, so slime captures "
                   f"nothing for it; distprof captures it where your code builds Profiler(config, role={t!r})")
    if a["tensorboard_dir"]:
        path = b.as_path(flag("tensorboard_dir"), a["tensorboard_dir"])
        if path is not None:
            b.set("save_path", path, flag("tensorboard_dir"))
    else:
        b.error(flag("tensorboard_dir"), a["tensorboard_dir"], "slime writes torch traces to --tensorboard-dir; "
                                                                "set it (it becomes save_path)")


def _ignored(b: Builder, args: Mapping[str, Any]) -> None:
    """Megatron's profiling flags that slime does not act on: dropped, each with why."""
    for k in ("profile", "pytorch_profiler_collect_shapes", "pytorch_profiler_collect_callstack",
              "pytorch_profiler_collect_chakra"):
        if args.get(k):
            why = ("slime's training loop does not drive Megatron's nsys capture range; use a distprof nsys backend"
                   if k == "profile" else "slime ignores Megatron's collect flags (it hard-codes its own; see "
                                          "SLIME_PROFILE_*)")
            b.drop(flag(k), True, why)


def _torch_flags(b: Builder, env: Mapping[str, tuple[str, str]]) -> None:
    b.set("backend", "torch", flag("use_pytorch_profiler"), True)
    for var, field in ENV_FLAGS.items():
        if var in env:
            src, raw = env[var]
            on = b.as_bool(src, raw)
            if on is not None:
                b.set(f"torch.{field}", on, src, raw)
        else:
            b.set(f"torch.{field}", True, flag("use_pytorch_profiler"), True,
                  note=f"slime hard-codes {field}=True ({var}=0 turns it off)")


def _ranks(b: Builder, a: Mapping[str, Any], given, env: Mapping[str, tuple[str, str]]) -> None:
    if given("profile_ranks") and a["profile_ranks"]:
        ranks = b.as_int_list(flag("profile_ranks"), a["profile_ranks"], what="global ranks")
        if ranks:
            b.set("ranks", sorted(set(ranks)), flag("profile_ranks"), a["profile_ranks"],
                  note="slime itself ignores --profile-ranks and profiles every rank; distprof honours it")
        return
    if ENV_ALL_RANKS in env:
        src, raw = env[ENV_ALL_RANKS]
        on = b.as_bool(src, raw)
        if on is not None:
            b.set("ranks", "all" if on else [0], src, raw)
        return
    b.set("ranks", "all")
    b.note(flag("profile_ranks"), None, "ranks", "not given: slime profiles every rank")


def _memory(b: Builder, a: Mapping[str, Any], given, save_path_set: bool) -> None:
    r = f"per_role.{MEMORY_ROLE}"
    recorder = a["memory_recorder"]
    num = a["memory_snapshot_num_steps"]
    if recorder == "torch":
        b.set(f"{r}.backend", "cuda_memory", flag("memory_recorder"), recorder)
        b.set(f"{r}.cuda_memory", {"stacks": "all", "max_entries": 1_000_000, "dump_on_oom": True},
              flag("record_memory_history"), True, note="slime's recorder: C++ and Python stacks, 1,000,000 entries, "
                                                         "a snapshot on OOM")
    elif recorder == "memray":
        b.set(f"{r}.backend", "memray", flag("memory_recorder"), recorder,
              note="memray wraps the worker process: it records the worker's whole life")
        if num is None:
            b.error(flag("memory_snapshot_num_steps"), None, "slime's memray recorder needs it; set it")
    else:
        b.error(flag("memory_recorder"), recorder, "use torch or memray")
        return
    if num is not None:
        n = b.as_int(flag("memory_snapshot_num_steps"), num, minimum=1)
        steps = b.as_range(flag("memory_snapshot_num_steps"), num, 0, n) if n is not None else None
        if steps is not None:
            b.set(f"{r}.steps", steps, flag("memory_snapshot_num_steps"), num,
                  note="slime records from the start and dumps after rollout num_steps-1")
    elif recorder == "torch":
        total = a["num_rollout"]
        n = b.as_int(flag("num_rollout"), total, minimum=1) if total is not None else None
        steps = b.as_range(flag("num_rollout"), total, 0, n) if n is not None else None
        if steps is not None:
            b.set(f"{r}.steps", steps, flag("num_rollout"), total,
                  note="without --memory-snapshot-num-steps slime records the whole run and dumps only on OOM; "
                       "distprof records rollouts 0..num_rollout-1 and dumps at the end and on OOM")
        else:
            b.error(flag("memory_snapshot_num_steps"), None,
                    "without it slime records the whole run and dumps only on OOM; distprof needs the rollouts to "
                    "record: set --memory-snapshot-num-steps (or --num-rollout)")
    if not save_path_set:
        path = b.as_path(flag("memory_snapshot_dir"), a["memory_snapshot_dir"])
        if path is not None:
            b.set("save_path", path, flag("memory_snapshot_dir"), a["memory_snapshot_dir"])
    elif given("memory_snapshot_dir"):
        b.drop(flag("memory_snapshot_dir"), a["memory_snapshot_dir"],
               f"distprof writes snapshots under save_path, in {{save_path}}/{MEMORY_ROLE}/rank{{R}}/")
    if given("memory_snapshot_path"):
        b.drop(flag("memory_snapshot_path"), a["memory_snapshot_path"],
               "distprof names snapshots by role, rank and steps")
