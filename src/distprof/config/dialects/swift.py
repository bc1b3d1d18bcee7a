"""ms-swift: ``--enable_profiler true --profiler_save_path ... --profiler_steps ...`` (ms-swift PR #9449).

ms-swift's main branch has no profiler; these arguments are those of PR #9449, a port of verl's design, which
users of that branch write. The config is a mapping (a ``swift ... --config`` YAML, or the arguments dataclass),
an argparse Namespace, or the command line's arguments (a list of tokens or one string).

Rules:

- Steps are Hugging Face Trainer global steps as ``on_step_begin`` sees them (``state.global_step``, 0 before
  the first optimizer step): distprof's HF callback counts the same way, so they are kept as they are.
- ``profiler_all_ranks`` -> ranks all; ``profiler_ranks`` -> those ranks; one of them is required.
- ``profiler_contents`` (cpu, cuda, stack, memory, shape): CPU activity always, cuda when listed; stack ->
  with_stack; memory -> profile_memory; shape (or shapes) -> record_shapes.
- ``profiler_tool``: torch (the only tool the PR implements); ``profiler_discrete`` -> discrete.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import MISSING, normalize_keys, parse_flags
from distprof.config.dialects.translation import Builder

SPEC: dict[str, dict[str, Any]] = {
    "enable_profiler": {},
    "profiler_save_path": {},
    "profiler_all_ranks": {},
    "profiler_ranks": {"nargs": "+"},
    "profiler_contents": {"nargs": "+"},
    "profiler_discrete": {},
    "profiler_tool": {},
    "profiler_steps": {"nargs": "+"},
    "max_steps": {},
}
DEFAULTS: dict[str, Any] = {"enable_profiler": False, "profiler_save_path": None, "profiler_all_ranks": False,
                            "profiler_ranks": [], "profiler_contents": [], "profiler_discrete": False,
                            "profiler_tool": "torch", "profiler_steps": [], "max_steps": -1}
CONTENTS = {"cpu": None, "cuda": None, "stack": "with_stack", "memory": "profile_memory", "shape": "record_shapes",
            "shapes": "record_shapes"}


def looks_like(data: Mapping[str, Any]) -> bool:
    return "enable_profiler" in normalize_keys(data)


def flag(dest: str) -> str:
    return f"--{dest}"


def translate(b: Builder) -> None:
    got = _arguments(b)
    if got is None:
        return
    args, rest = got
    a = {**DEFAULTS, **{k: v for k, v in args.items() if v is not None}}
    b.unknown_keys({k: v for k, v in rest.items() if k.startswith(("--profiler", "--enable_profiler"))}, "",
                   [flag(k) for k in SPEC], "ms-swift profiler argument")

    enable = b.as_bool(flag("enable_profiler"), a["enable_profiler"])
    b.set("enable", bool(enable), flag("enable_profiler"), a["enable_profiler"])
    if not enable:
        b.captures_nothing("--enable_profiler is false")
        return
    tool = a["profiler_tool"]
    if tool != "torch":
        b.error(flag("profiler_tool"), tool, "ms-swift's profiler implements only torch (others silently do nothing); "
                                             "use torch")
    else:
        b.set("backend", "torch", flag("profiler_tool"), tool)
    if a["profiler_save_path"]:
        path = b.as_path(flag("profiler_save_path"), a["profiler_save_path"])
        if path is not None:
            b.set("save_path", path, flag("profiler_save_path"))
    else:
        b.error(flag("profiler_save_path"), None, "required when --enable_profiler is true")
    _steps_and_ranks(b, a)
    _contents(b, a)
    discrete = b.as_bool(flag("profiler_discrete"), a["profiler_discrete"])
    if discrete:
        b.set("discrete", True, flag("profiler_discrete"), a["profiler_discrete"],
              note="ms-swift's PR refuses it; distprof traces each annotated stage of a profiled step on its own")
    _last_step(b, a)


def _arguments(b: Builder) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """ms-swift's profiler arguments and the others (named like flags), or None (an error recorded)."""
    data = b.data
    rest: dict[str, Any] = {}  # the other arguments: those named like the profiler's are listed as unknown
    if isinstance(data, (list, tuple, str)):
        try:
            args = parse_flags(data, {k: {**v, "flags": [f"--{k}"]} for k, v in SPEC.items()}, rest)
        except ValueError as e:
            b.error("arguments", MISSING, str(e))
            return None
    elif isinstance(data, Mapping):
        args = {k: v for k, v in normalize_keys(data).items() if k in SPEC}
        rest = {flag(k): v for k, v in normalize_keys(data).items() if k not in SPEC}
    else:
        b.error("arguments", data, "expected ms-swift's arguments: a mapping, an argparse Namespace or a list of flags")
        return None
    return args, rest


def _steps_and_ranks(b: Builder, a: Mapping[str, Any]) -> None:
    steps = b.as_int_list(flag("profiler_steps"), a["profiler_steps"], what="global steps")
    if steps == []:
        b.error(flag("profiler_steps"), a["profiler_steps"], "required: the global steps to profile, e.g. 5 6 7")
    elif steps:
        b.set("steps", sorted(set(steps)), flag("profiler_steps"), a["profiler_steps"],
              note="HF global steps as on_step_begin sees them (0 before the first optimizer step); distprof's HF "
                   "callback counts the same way")
    all_ranks = b.as_bool(flag("profiler_all_ranks"), a["profiler_all_ranks"])
    if all_ranks:
        b.set("ranks", "all", flag("profiler_all_ranks"), a["profiler_all_ranks"])
    elif a["profiler_ranks"]:
        ranks = b.as_int_list(flag("profiler_ranks"), a["profiler_ranks"], what="global ranks")
        if ranks:
            b.set("ranks", sorted(set(ranks)), flag("profiler_ranks"), a["profiler_ranks"])
    else:
        b.error(flag("profiler_ranks"), a["profiler_ranks"], "give --profiler_ranks (e.g. 0) or --profiler_all_ranks "
                                                              "true; ms-swift requires one of them")


def _contents(b: Builder, a: Mapping[str, Any]) -> None:
    """--profiler_contents: the activities and torch.profiler flags."""
    contents = b.as_str_list(flag("profiler_contents"), a["profiler_contents"])
    if contents is not None:
        bad = [c for c in contents if c not in CONTENTS]
        if bad:
            b.error(flag("profiler_contents"), a["profiler_contents"],
                    f"{', '.join(map(repr, bad))} unknown; use cpu, cuda, stack, memory, shape")
        elif not contents:
            b.error(flag("profiler_contents"), a["profiler_contents"], "required: e.g. cpu cuda")
        else:
            b.set("torch.activities", ["cpu", "cuda"] if "cuda" in contents else ["cpu"], flag("profiler_contents"),
                  a["profiler_contents"], note="CPU activity is always recorded")
            for c in contents:
                if CONTENTS[c]:
                    b.set(f"torch.{CONTENTS[c]}", True, flag("profiler_contents"), a["profiler_contents"],
                          note=f"'{c}' -> torch.{CONTENTS[c]}")


def _last_step(b: Builder, a: Mapping[str, Any]) -> None:
    max_steps = b.as_int(flag("max_steps"), a["max_steps"], minimum=None)
    if max_steps is not None and max_steps > 0:
        b.last_step = (flag("max_steps"), max_steps - 1)  # global steps 0 .. max_steps-1 begin
