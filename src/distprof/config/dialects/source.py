"""Another framework's config as data a dialect reads: interpolations, flag lists, bounded values for messages.

Files and objects are read by the one loader (:mod:`distprof.config.load`: bounded, safe loaders only).
OmegaConf-style interpolations are resolved here without OmegaConf's resolvers, so a config cannot read the
environment (``${oc.env:...}``) into what ``distprof validate`` prints: only ``${a.b}`` and
``${oc.select:a.b,default}``.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from distprof.config.errors import MISSING, Unresolved, clip, short

__all__ = [
    "MISSING",
    "Unresolved",
    "clip",
    "get",
    "normalize_keys",
    "parse_flags",
    "resolve_interpolations",
    "short",
]


def get(data: Any, path: str, default: Any = MISSING) -> Any:
    cur = data
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return default
        cur = cur[part]
    return cur


# ---- interpolations ---------------------------------------------------------------------------------------
_MAX_CHARS = 1_000_000
_INTERP = re.compile(r"\$\{([^${}]*)\}")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*")


def resolve_interpolations(data: Any, limit: int = 2_000_000) -> Any:
    """``data`` with ``${a.b}`` and ``${oc.select:a.b,default}`` replaced as OmegaConf would (paths from the
    top of ``data``); any other interpolation becomes an :class:`Unresolved` that a dialect reports only if it
    reads that field. Interpolations copy what they point at, so the values made are counted: past ``limit``
    (an interpolation bomb, like YAML's billion laughs) this raises ValueError."""
    made = [0]
    chars = [0]  # characters made by string interpolation, all strings together

    def value_of(text: str, depth: int) -> Any:
        m = _INTERP.fullmatch(text.strip())
        if m:
            return one(m.group(1), text, depth)
        parts = []
        pos = 0
        for m in _INTERP.finditer(text):
            v = one(m.group(1), text, depth)
            if isinstance(v, Unresolved):
                return v
            parts.append(text[pos:m.start()])
            parts.append("null" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
            pos = m.end()
            chars[0] += len(parts[-1])
            if chars[0] > _MAX_CHARS:  # strings built from strings: each level can multiply the length
                raise ValueError(f"the config's interpolations build strings past {_MAX_CHARS:,} characters; this "
                                 "is not a training config (an interpolation bomb?)")
        parts.append(text[pos:])
        return "".join(parts)

    def one(expr: str, text: str, depth: int) -> Any:
        if depth > 10:
            return Unresolved(text, "interpolations refer to each other in a loop")
        default: Any = MISSING
        if expr.startswith("oc.select:"):
            path, _, dflt = expr[len("oc.select:"):].partition(",")
            if _:
                default = _scalar(dflt.strip())
        else:
            path = expr
        path = path.strip()
        if not _PATH.fullmatch(path):
            return Unresolved(text, "distprof resolves only ${a.b} and ${oc.select:a.b,default}")
        v = get(data, path)
        if v is MISSING:
            if default is MISSING:
                return Unresolved(text, f"{path} is not in this config")
            return default
        return walk(v, depth + 1)

    def walk(v: Any, depth: int = 0) -> Any:
        made[0] += 1
        if made[0] > limit:
            raise ValueError(f"the config's interpolations expand it past {limit:,} values; this is not a training "
                             "config (an interpolation bomb?)")
        if isinstance(v, str):
            return value_of(v, depth) if "${" in v else v
        if isinstance(v, _SCALARS):  # before the (slow) Mapping check: a long list is mostly scalars
            return v
        if isinstance(v, Mapping):
            return {k: walk(x, depth) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, depth) for x in v]
        return v

    return walk(data)


_SCALARS = (int, float, type(None))


def _scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return text


# ---- command-line flags -----------------------------------------------------------------------------------
def parse_flags(tokens: Sequence[str] | str, spec: Mapping[str, dict[str, Any]],
                rest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Flags such as ``--profile-step-start 3 --profile-target train_overall`` as {dest: value}, for the
    flags in ``spec`` (dest -> argparse keywords); every other flag of the framework is ignored (``rest``, when
    given, learns them: {"--flag": value or True}). ``tokens`` may be one string (a launch script's arguments)
    or a list."""
    if isinstance(tokens, str):
        tokens = shlex.split(tokens, comments=True)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for dest, kw in spec.items():
        names = kw.get("flags") or [f"--{dest.replace('_', '-')}", f"--{dest}"]
        names = list(dict.fromkeys(names))
        parser.add_argument(*names, dest=dest, default=MISSING,
                            **{k: v for k, v in kw.items() if k != "flags"})
    try:
        ns, others = parser.parse_known_args([str(t) for t in tokens])
    except argparse.ArgumentError as e:
        raise ValueError(f"{e.argument_name or 'arguments'}: {e.message}") from None
    if rest is not None:
        for i, t in enumerate(others):
            if t.startswith("--"):
                name, eq, value = t.partition("=")
                nxt = others[i + 1] if i + 1 < len(others) and not others[i + 1].startswith("--") else True
                rest[name] = value if eq else nxt
    return {k: v for k, v in vars(ns).items() if v is not MISSING}


def normalize_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Flag-style keys (``--profile-step-start``, ``profile-step-start``) as argparse dests (``profile_step_start``)."""
    return {str(k).lstrip("-").replace("-", "_"): v for k, v in data.items()}
