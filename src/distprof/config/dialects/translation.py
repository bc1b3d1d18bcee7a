"""A translated config: the distprof settings, how each source field became one, what was dropped and why,
every error at once, and warnings for a config that is valid but captures less than it asks for (or nothing).

A dialect module fills a :class:`Builder` (reading fields with ``get``/``as_*``, writing distprof fields with
``set``); :func:`finish` validates what it wrote field by field, so a config with three mistakes reports three
errors, each named by its source field, then builds the :class:`~distprof.config.model.ProfilerConfig`.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from distprof.config.dialects.source import get
from distprof.config.errors import (
    MAX_MESSAGE,
    MISSING,
    ConfigError,
    Problem,
    Unresolved,
    clip,
    cut,
    label_of,
    nest,
    short,
    suggest,
)
from distprof.config.limits import MAX_ROLES, MAX_STEPS, PATH_FIX, check_roles, path_text
from distprof.config.plan import role_selected

__all__ = ["Builder", "ConfigClass", "Dropped", "Mapped", "Problem", "Translation", "finish"]



class ConfigClass(Protocol):
    """The config class a translation validates with (``ProfilerConfig``), passed in by the caller: the dialects
    sit below the model and never import it."""

    def model_validate(self, obj: Any, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Mapped:
    """``source`` (the field as the framework names it) with ``value`` became distprof's ``target``."""

    source: str
    value: Any
    target: str
    note: str = ""
    result: Any = MISSING  # the value the distprof field got (MISSING: honoured without setting a field)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "value": clip(self.value), "target": self.target,
                "result": clip(self.result), "note": self.note}


@dataclass(frozen=True)
class Dropped:
    """``source`` is not honoured, for ``reason``; ``unknown``: a key the dialect does not know (a typo, or a
    setting of a newer release), ignored."""

    source: str
    value: Any
    reason: str
    unknown: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "value": clip(self.value), "reason": self.reason, "unknown": self.unknown}


@dataclass
class Translation:
    """The result of ``distprof.config.dialects.translate``."""

    dialect: str
    section: str | None
    config: dict[str, Any]  # the distprof config, as a dict (what ProfilerConfig.from_dict would take)
    profiler_config: Any  # the built ProfilerConfig, or None when there are errors
    mapping: list[Mapped] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    _roles: tuple[Any, dict[str, dict[str, Any]]] | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.errors and self.profiler_config is not None

    def roles(self) -> dict[str, dict[str, Any]]:
        """What each role's Profiler does: per role the config names, and ``*`` for any other role when the config
        does not restrict roles."""
        pc = self.profiler_config
        if pc is None:
            return {}
        if self._roles is None or self._roles[0] is not pc:  # each name costs a validation: once per config
            names = list(dict.fromkeys([*(pc.roles or []), *pc.per_role]))
            if pc.roles is None:
                names.insert(0, "*")
            self._roles = (pc, {role: _role_summary(pc, role) for role in names})
        return self._roles[1]

    def raise_for_errors(self) -> None:
        """One ConfigError (a ValueError) listing every error, one line each (``ProfilerConfig.from_dialect``
        calls this); its ``problems`` are (source field, value, line)."""
        if self.ok:
            return
        errors = self.errors or [Problem.about(self.dialect, MISSING, "could not be translated")]
        n = len(errors)
        raise ConfigError([Problem(e.field, "" if e.value is MISSING else short(e.value), e.message) for e in errors],
                          title=f"{self.dialect} config has {n} problem{'s' if n != 1 else ''}:")

    def to_dict(self) -> dict[str, Any]:
        pc = self.profiler_config
        return {
            "dialect": self.dialect,
            "section": self.section,
            "valid": self.ok,
            "config": pc.model_dump(mode="json") if pc is not None else _jsonable(self.config),
            "roles": self.roles(),
            "mapping": [m.to_dict() for m in self.mapping],
            "dropped": [d.to_dict() for d in self.dropped],
            "errors": [e.to_dict() for e in self.errors],
            "warnings": [w.to_dict() for w in self.warnings],
        }


def _jsonable(v: Any) -> Any:
    return clip(v, depth=8, items=1000, chars=2000)


def _role_summary(pc: Any, role: str) -> dict[str, Any]:
    eff = pc if role == "*" else pc.for_role(role)
    # a name of roles selects itself: only per_role's other names are matched against the globs
    captures = bool(eff.enable and (role == "*" or role in (pc.roles or ()) or role_selected(pc.roles, role)))
    out: dict[str, Any] = {"captures": captures, "backend": eff.backend, "ranks": eff.ranks,
                           "steps": eff.steps, "schedule": eff.schedule.model_dump() if eff.schedule else None}
    if eff.steps is None and eff.schedule is None:
        out["steps"] = "whole lifetime" if eff.whole_lifetime else None
        if not eff.whole_lifetime:
            out["schedule"] = eff.effective_schedule.model_dump()
    if eff.discrete:
        out["discrete"] = True
    if eff.backend == "torch":
        t = eff.torch
        out["torch"] = {"activities": t.activities, **{k: True for k in ("record_shapes", "profile_memory",
                                                                          "with_stack",
                                                                          "with_flops", "with_modules")
                                                         if getattr(t, k)}}
    elif eff.is_process_backend:
        opts = getattr(eff, eff.backend)
        out[eff.backend] = {"options": dict(opts.options), "flags": list(opts.flags), "env": dict(opts.env)}
    return out


class Builder:
    """What a dialect module writes into: distprof settings, and the record of how they came about."""

    def __init__(self, dialect: str, data: Any, env: Mapping[str, str]):
        self.dialect = dialect
        self.data = data
        self.env = env
        self.config: dict[str, Any] = {}
        self.mapping: list[Mapped] = []
        self.dropped: list[Dropped] = []
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []
        self.error_lines: set[str] = set()  # the distprof config problems listed, each once
        self.nothing: list[str] = []  # why nothing would be captured, in the framework's own terms
        self.last_step: tuple[str, int] | None = None  # (source field, the last global step the job runs)
        self.world_size: tuple[str, int] | None = None  # (source fields, ranks in the job)

    # ---- reading -------------------------------------------------------------------------------------------
    def get(self, path: str, default: Any = MISSING, data: Any = None) -> Any:
        """The value at dotted ``path`` (of ``data``, default the whole config); an unresolvable interpolation
        is reported as an error and read as ``default``."""
        v = get(self.data if data is None else data, path, MISSING)
        if v is MISSING:
            return default
        bad = _find_unresolved(v)
        if bad is not None:
            self.error(path, bad, f"interpolation not resolved: {bad.why}; write the value itself")
            return default
        return v

    def as_bool(self, source: str, v: Any) -> bool | None:
        if isinstance(v, bool):
            return v
        if isinstance(v, (int, float)) and v in (0, 1):
            return bool(v)
        if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
            return v.strip().lower() in _TRUE
        self.error(source, v, "expected true or false")
        return None

    def as_int(self, source: str, v: Any, minimum: int | None = 0, what: str = "a whole number") -> int | None:
        if (isinstance(v, float) and v.is_integer()) or (isinstance(v, str) and _INT.fullmatch(v)):
            v = int(v)
        elif not isinstance(v, int) or isinstance(v, bool):
            self.error(source, v, f"expected {what}")
            return None
        if minimum is not None and v < minimum:
            self.error(source, v, f"must be >= {minimum}")
            return None
        return v

    def as_int_list(self, source: str, v: Any, minimum: int = 0, what: str = "step numbers") -> list[int] | None:
        """A list of whole numbers (a single number or a comma/space separated string also accepted); all the
        bad items are reported in one error."""
        if isinstance(v, (int, str)) and not isinstance(v, bool):
            v = [p for p in re.split(r"[,\s]+", v.strip("[] ")) if p] if isinstance(v, str) else [v]
        if not isinstance(v, (list, tuple)):
            self.error(source, v, f"expected a list of {what}, e.g. [1, 2, 5]")
            return None
        out, bad = [], []
        for item in v:
            if isinstance(item, bool):
                bad.append(item)
                continue
            if isinstance(item, str) and _INT.fullmatch(item):
                item = int(item)
            if isinstance(item, float) and item.is_integer():
                item = int(item)
            if not isinstance(item, int) or item < minimum:
                bad.append(item)
            else:
                out.append(item)
        if bad:
            self.error(source, v, f"holds {', '.join(map(short, bad[:5]))} where {what} (whole numbers >= {minimum}) "
                                  "are expected")
            return None
        return out

    def as_range(self, source: str, value: Any, start: int, stop: int, note: str = "") -> list[int] | None:
        """``range(start, stop)`` as a step list, refused (one error) when it is longer than any step list can be."""
        if stop - start > MAX_STEPS:
            self.error(source, value, f"spans {stop - start:,} steps, more than the {MAX_STEPS:,} a step list may "
                                      "hold; profile a short range")
            return None
        return list(range(start, stop))

    def as_path(self, source: str, v: Any) -> str | None:
        """A directory or URL setting: a string (or os.PathLike); anything else is one error naming ``source``."""
        text = path_text(v)
        if text is None:
            self.error(source, v, f"expected a directory or URL, got {_kind(v)}; {PATH_FIX}")
        return text

    def as_str_list(self, source: str, v: Any) -> list[str] | None:
        if isinstance(v, str):
            return [p for p in re.split(r"[,\s]+", v.strip()) if p]
        if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            return list(v)
        self.error(source, v, "expected a list of names")
        return None

    # ---- writing ---------------------------------------------------------------------------------------------
    def set(self, target: str, value: Any, source: str | None = None, src_value: Any = MISSING,
            note: str = "") -> None:
        """Set distprof field ``target`` (dotted: ``torch.record_shapes``, ``per_role.actor.ranks``); record that
        ``source`` (with ``src_value``, default ``value``) became it."""
        cur = self.config
        parts = target.split(".")
        if parts[0] == "per_role" and len(parts) > 2:
            cur = cur.setdefault("per_role", {}).setdefault(parts[1], {})
            parts = parts[2:]
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
        if source is not None:
            self.mapping.append(Mapped(source, value if src_value is MISSING else src_value, target, note, value))

    def note(self, source: str, value: Any, target: str, note: str) -> None:
        """Record how ``source`` is honoured without setting a field (distprof does it anyway, or it is implied)."""
        self.mapping.append(Mapped(source, value, target, note))

    def drop(self, source: str, value: Any, reason: str) -> None:
        self.dropped.append(Dropped(source, value, reason))

    def unknown_keys(self, sec: Any, where: str, known: Iterable[str], what: str,
                     source: Callable[[Any], str] | None = None) -> None:
        """Every key of ``sec`` (the section at ``where``) that is not in ``known`` is dropped as unknown, so a
        typo or a setting distprof does not read is listed instead of silently ignored. ``source(key)`` names
        the dropped field (default ``where.key``)."""
        if not isinstance(sec, Mapping):
            return
        known = list(known)
        for k in sec:
            if k not in known:
                tip = suggest(k, known)
                key = cut(str(k), 80)  # a config is untrusted: a key may be megabytes long
                name = source(k) if source else f"{where}.{key}" if where else key
                self.dropped.append(Dropped(name, sec[k],
                                            f"unknown {what}{'; ' + tip if tip else ''}; ignored: distprof "
                                            "does not read it", unknown=True))

    def section_fields(self, sec: Mapping[str, Any], where: str, known: Mapping[str, Any], what: str
                       ) -> tuple[dict[str, Any], Any]:
        """A framework's settings section: every key it does not know is an error (with a did-you-mean);
        returns (each known field's value or its default, ``src(key)`` naming a field where it was read)."""
        def src(k: str) -> str:
            return f"{where}.{k}" if where else k

        for k in sec:
            if k not in known:
                tip = suggest(k, known)
                self.error(src(str(k)), sec[k], f"not a {what} field{'; ' + tip if tip else ''}")
        return {k: sec.get(k, d) for k, d in known.items()}, src

    def job_size(self, last_step: str, nodes: str, gpus: str) -> None:
        """The job's last global step (steps 1..N) and world size (nodes x GPUs per node), where the framework's
        config states them: the warnings about steps or ranks that would never be reached use them."""
        total = self.get(last_step, None)
        if total is not None:
            n = self.as_int(last_step, total, minimum=1)
            if n is not None:
                self.last_step = (last_step, n)
        a, c = self.get(nodes, None), self.get(gpus, None)
        if a is not None and c is not None:
            n_nodes = self.as_int(nodes, a, minimum=1)
            n_gpus = self.as_int(gpus, c, minimum=1)
            if n_nodes and n_gpus:
                self.world_size = (f"{nodes} * {gpus}", n_nodes * n_gpus)

    def error(self, source: str, value: Any, message: str) -> None:
        # a message may list what it refuses (slime's targets, verl's contents): one line, cut as config_errors cuts
        self.errors.append(Problem.about(source, value, cut(message, MAX_MESSAGE)))

    def warn(self, source: str, value: Any, message: str) -> None:
        self.warnings.append(Problem.about(source, value, message))

    def captures_nothing(self, reason: str) -> None:
        self.nothing.append(reason)


def _kind(v: Any) -> str:
    if v is None or isinstance(v, bool):
        return "null" if v is None else str(v).lower()
    kinds = {dict: "a mapping", list: "a list", tuple: "a list", int: "a number", float: "a number"}
    return kinds.get(type(v), f"a {type(v).__name__}")


_INT = re.compile(r"\s*-?[0-9]{1,18}\s*")  # more digits is a typo (and int() of thousands of digits raises)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _find_unresolved(v: Any) -> Unresolved | None:
    if isinstance(v, Unresolved):
        return v
    if isinstance(v, (str, int, float, type(None))):  # before the (slow) Mapping check
        return None
    if isinstance(v, Mapping):
        for x in v.values():
            u = _find_unresolved(x)
            if u is not None:
                return u
    elif isinstance(v, list):
        for x in v:
            u = _find_unresolved(x)
            if u is not None:
                return u
    return None


# ---- validation ------------------------------------------------------------------------------------------------
MAX_ERRORS = 100  # problems listed for one config


def finish(b: Builder, section: str | None, config: ConfigClass) -> Translation:
    """Validate what ``b`` wrote (each field alone, so every bad one is reported), build the ``config`` (the
    ProfilerConfig class) when nothing is wrong, and add the warnings for what would capture nothing."""
    t = Translation(b.dialect, section, b.config, None, b.mapping, b.dropped, list(b.errors), list(b.warnings))
    _validate_fields(b, t, config)
    if not t.errors:
        try:  # DISTPROF_* environment variables are applied here, as they are at run time
            t.profiler_config = config.model_validate(b.config)
        except ValueError as e:
            for p in _problems(e):
                _add(b, t, p)
    if t.profiler_config is not None:
        _warnings(b, t)
    return t


def _validate_fields(b: Builder, t: Translation, config: ConfigClass) -> None:
    skipped = [0]

    def check(prefix: str, fields: Mapping[str, Any]) -> None:
        for name, value in fields.items():
            if name in ("per_role", "enable"):  # enable alone would demand save_path; it is a plain bool anyway
                continue
            if len(t.errors) >= MAX_ERRORS:  # nobody reads more, and naming each costs a scan of the mapping
                skipped[0] += 1
                continue
            try:
                config.model_validate({name: value}, context={"no_env": True, "fields_only": True})
            except ValueError as e:
                for p in _problems(e):
                    _add(b, t, p if p.field else dataclasses.replace(p, field=name), prefix)

    check("", b.config)
    per_role = b.config.get("per_role")
    if isinstance(per_role, Mapping) and len(per_role) > MAX_ROLES:  # refused before a check per role
        try:
            check_roles("per_role", per_role, "entries")
        except ValueError as e:
            _add(b, t, Problem("per_role", "", str(e)))
        per_role = None
    for role, over in (per_role.items() if isinstance(per_role, Mapping) else ()):
        if isinstance(over, Mapping):  # anything else is refused, named, by the whole config's check
            check(f"per_role.{role}.", over)
    if skipped[0]:
        t.errors.append(Problem.about("distprof config", MISSING, f"... and {skipped[0]:,} more fields not checked "
                                                             f"(only the first {MAX_ERRORS} problems are listed)"))


def _problems(e: ValueError) -> list[Problem]:
    """The problems of a config error (ProfilerConfig raises ConfigError; anything else is one line)."""
    problems = getattr(e, "problems", None)
    if problems is not None:
        return list(problems)
    return [Problem("", "", str(e))]


def _add(b: Builder, t: Translation, p: Problem, prefix: str = "") -> None:
    """A distprof config problem as an error of the translation, named in the user's terms, listed once.

    A value from a ``DISTPROF_*`` variable is named by the variable (with its value, not the file's); in a
    distprof config the problem's own line names the field; in another framework's, the source fields that
    became it lead the line."""
    if prefix:
        p = nest(p, prefix.rstrip("."))
    target = re.sub(r"\[\d+\]", "", p.field)
    label = label_of(p)
    if label:
        problem = Problem.about(label, _literal(p.value), p.message, text=p.message)
    elif b.dialect == "distprof":
        problem = Problem.about(target or "distprof config", _value_at(b.config, target) if target else MISSING,
                                p.message,
                          text=p.message)
    elif target:
        problem = Problem.about(_sources_for(b, target), _value_at(b.config, target), p.message)
    else:
        problem = Problem.about("distprof config", MISSING, p.message)
    if str(problem) not in b.error_lines:
        b.error_lines.add(str(problem))
        t.errors.append(problem)


def _literal(shown: str) -> Any:
    try:
        return ast.literal_eval(shown)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return shown


def _value_at(config: Mapping[str, Any], target: str) -> Any:
    parts = target.split(".")
    if parts[0] == "per_role" and len(parts) > 2:
        config = (config.get("per_role") or {}).get(parts[1], {})
        parts = parts[2:]
    return get(config, ".".join(parts), MISSING)


def _sources_for(b: Builder, target: str) -> str:
    """The source fields that became ``target`` (or a part of it), for naming an error in the user's terms."""
    hits = [m.source for m in b.mapping
            if m.target == target or m.target.startswith(target + ".") or target.startswith(m.target + ".")]
    if not hits and target.startswith("per_role.") and target.count(".") >= 2:
        inherited = target.split(".", 2)[2]  # a role's field may come from the top level
        hits = [m.source for m in b.mapping if m.target == inherited or m.target.startswith(inherited + ".")]
    hits = list(dict.fromkeys(hits))
    return ", ".join(hits) if hits else target


def _warnings(b: Builder, t: Translation) -> None:
    """Valid, but captures less than it says: nothing enabled, steps past the job's end, ranks beyond its size."""
    pc = t.profiler_config
    if not pc.enable:
        if pc.telemetry or pc.hang.enabled:  # no trace, but every rank keeps its telemetry / hang evidence
            return
        why = "; ".join(b.nothing) or "profiling is not enabled"
        t.warnings.append(Problem.about(b.dialect, MISSING, f"this config captures nothing: {why}"))
        return
    summaries = t.roles()
    if summaries and not any(s["captures"] for s in summaries.values()):
        why = "; ".join(b.nothing) or "no role is enabled"
        t.warnings.append(Problem.about(b.dialect, MISSING, f"this config captures nothing: {why}"))
        return
    for role, s in summaries.items():
        if not s["captures"]:
            continue
        eff = pc if role == "*" else pc.for_role(role)
        who = "" if role == "*" else f"role {role}: "
        if b.last_step is not None:
            src, last = b.last_step
            _check_steps(t, eff, who, src, last)
        if b.world_size is not None and isinstance(eff.ranks, list):
            src, n = b.world_size
            beyond = [r for r in eff.ranks if r >= n]
            if beyond:
                all_gone = len(beyond) == len(eff.ranks)
                t.warnings.append(Problem.about(
                    src, n, f"{who}ranks {beyond} do not exist in a job of {n} ranks (0..{n - 1}); "
                            f"{'nothing would be captured and ' if all_gone else ''}distprof's Profiler refuses "
                            "them when it starts: remove them or select all ranks"))


def _check_steps(t: Translation, eff: Any, who: str, src: str, last: int) -> None:
    if eff.steps is not None:
        late = [s for s in eff.steps if s > last]
        if late and len(late) == len(eff.steps):
            t.warnings.append(Problem.about(src, last, f"{who}captures nothing: every profiled step ({_steps(late)}) "
                                                       "comes "
                                                 f"after the job's last step {last}; profile earlier steps"))
        elif late:
            t.warnings.append(Problem.about(src, last, f"{who}steps {_steps(late)} come after the job's last step "
                                                       f"{last} and "
                                                 "will not be captured"))
        return
    if eff.schedule is not None:
        w = eff.plan().next_window(0)
        if w is not None and w.start > last:
            t.warnings.append(Problem.about(src, last, f"{who}captures nothing: the schedule's first window records "
                                                       "step "
                                                 f"{w.start}, after the job's last step {last}"))


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (f" ... ({len(steps)} steps)" if len(steps) > 8 else "")
