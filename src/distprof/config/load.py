"""The one config loader: files (YAML, JSON, TOML), OmegaConf objects, argparse namespaces and dataclasses, read
as plain dicts and lists, bounded before anything walks them.

``ProfilerConfig.from_yaml`` / ``from_dict`` / ``from_args`` and the dialects (``distprof validate``,
``ProfilerConfig.from_dialect``) all read through here, so a file is read the same way whoever asks:

- a regular file (a FIFO or a device would block), at most 4 MB, UTF-8 (a BOM is dropped);
- by its suffix: ``.json`` (msgspec), ``.toml`` (tomllib), anything else YAML with the safe loader (no
  ``!!python/...`` tags), its events walked first so that nesting past 32 levels or anchors/aliases expanding
  past 2,000,000 values are refused before a single object is built;
- nesting too deep for Python's parsers and numbers with thousands of digits refused by one line.

Every refusal is one :class:`~distprof.config.errors.ConfigFileError` (a ``ConfigError``, so a ``ValueError``)
whose line names the file and the fix. OmegaConf objects: ``resolve=True`` lets OmegaConf resolve the job's own
interpolations (``${oc.env:HOME}`` in the training process's config), ``resolve=False`` leaves them for the
dialects' restricted resolver (a file shown by ``distprof validate`` must not read the environment). Environment
overrides (``DISTPROF_*``) are :mod:`.env`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from distprof.config.errors import ConfigError, ConfigFileError, cut, error, file_error, show
from distprof.config.limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES

__all__ = ["check_bounded", "is_omegaconf", "load_file", "load_mapping", "load_yaml", "read_config_text", "select",
           "to_plain"]

_CONTAINERS = (Mapping, list, tuple, set, frozenset)


# ---- bounds ------------------------------------------------------------------------------------------------
def check_bounded(data: Any, what: str) -> None:
    """Refuse input too deep or too big to be a config before anything walks it.

    Size counts shared parts (YAML aliases, or one list put in twice) as often as they are referred to, but
    each distinct container is visited once, so a "billion laughs" costs as little to refuse as to hold.
    """
    if not isinstance(data, _CONTAINERS):
        return
    size: dict[int, int] = {}  # id -> values inside, expanded
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = [c for c in ((*node.keys(), *node.values()) if isinstance(node, Mapping) else node)
                if isinstance(c, _CONTAINERS)]
        if done:
            on_path.discard(key)
            size[key] = len(node) + sum(size[id(c)] for c in kids)
            if size[key] > MAX_VALUES:
                raise error(f"{what} holds more than {MAX_VALUES:,} values (shared parts counted each time they "
                            "are used, e.g. YAML aliases: a 'billion laughs'?); a profiler config is a few dozen "
                            "values: write it without nested anchors/aliases")
            continue
        if key in size:
            continue
        if key in on_path or len(on_path) >= MAX_DEPTH:
            raise error(f"{what} nests mappings/lists more than {MAX_DEPTH} deep (or contains itself); "
                        "a profiler config is flat: write its values out")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in kids if id(c) not in size)


# ---- files -------------------------------------------------------------------------------------------------
def read_config_text(path: str | os.PathLike) -> str:
    """A config file's text, read as untrusted input: a regular file (a FIFO or device would block or never
    end), at most 4 MB, UTF-8 (a BOM is dropped). Every refusal is one ConfigFileError naming the file."""
    name = os.fspath(path)
    try:
        st = os.stat(name)
        if stat.S_ISDIR(st.st_mode):
            raise file_error(f"{name}: is a directory; give the config file itself")
        if not stat.S_ISREG(st.st_mode):
            raise file_error(f"{name}: not a regular file; give the path of a config file")
        with open(name, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # the file may grow between stat and read
    except OSError as e:
        raise file_error(f"{name}: cannot read the config file ({e.strerror or e}); check the path") from None
    if len(raw) > MAX_FILE_BYTES:
        raise file_error(f"{name}: larger than {MAX_FILE_BYTES >> 20} MB; a profiler config is a few lines")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise file_error(f"{name}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None


def load_file(path: str | os.PathLike) -> Any:
    """A YAML, JSON or TOML file as plain data (by its suffix; anything else is read as YAML).

    Raises one ConfigFileError naming the file for a missing file, a directory, a file over 4 MB, text that
    is not UTF-8, a parse error, an unsafe YAML tag, nesting / aliases past a config's size, nesting too deep
    for Python's parsers or a number with too many digits.
    """
    try:
        return _load_file(path)
    except RecursionError:
        raise file_error(f"{path}: nests too deep to read; a profiler config is a few levels deep") from None
    except ValueError as e:
        if isinstance(e, ConfigError) or "int_max_str_digits" not in str(e):
            raise
        raise file_error(f"{path}: holds a number with too many digits; this is not a training config") from None


def _load_file(path: str | os.PathLike) -> Any:
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".toml"):
        return load_yaml(p)
    text = read_config_text(p)
    data = _json(p, text.encode()) if suffix == ".json" else _toml(p, text)
    try:
        check_bounded(data, str(p))
    except ConfigError as e:
        raise file_error(str(e)) from None
    return data


def load_mapping(path: str | os.PathLike, fields: Any, section: str | None) -> tuple[dict[str, Any], str | None]:
    """A config file's top-level mapping, and the section to read: ``section`` when given, else a top-level
    ``distprof:`` / ``profiler:`` key when the file names none of ``fields`` (the settings) at its top."""
    data = load_file(path)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise file_error(f"{os.fspath(path)}: expected a mapping at the top of the config file, got "
                         f"{type(data).__name__}; write settings as 'key: value' lines")
    if section is None and not (set(data) & set(fields)):
        section = next((key for key in ("distprof", "profiler") if key in data), None)
    return dict(data), section


def _json(p: Path, raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise file_error(f"{p}: not valid JSON ({e})") from None


def _toml(p: Path, text: str) -> Any:
    # Imported here: only a .toml file needs it (tomllib is Python 3.11's; pyproject's floor is 3.10).
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise file_error(f"{p}: not valid TOML ({e})") from None


def load_yaml(path: str | os.PathLike) -> Any:
    """A YAML file read with the safe loader (libyaml's when present: same rules, faster), its shape checked
    first (:func:`_check_yaml_shape`)."""
    name = os.fspath(path)
    text = read_config_text(name)
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _check_yaml_shape(loader_cls, text, name)
        loader = loader_cls(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise _yaml_error(name, e) from None


def _too_deep(name: str, line: str) -> ConfigFileError:
    return file_error(f"{name}{line}: nests mappings/lists more than {MAX_DEPTH} deep; "
                      "a profiler config is flat: write its values out")


def _check_yaml_shape(loader_cls: Any, text: str, name: str) -> None:
    """Walk the YAML's events (no objects built) and refuse deep nesting or an alias blow-up before loading.

    Each anchor's size is its values counted with aliases expanded; an alias adds that size. A 358-byte
    "billion laughs" is refused at its first big alias, and libyaml is never asked to build deep nesting
    (it recurses in C, and its scanner slows down quadratically with depth: both stop at the first bad event).
    """
    sizes: dict[str, int] = {}
    stack: list[list[Any]] = [[None, 0]]  # open collections: [anchor, values so far]
    loader = loader_cls(text)
    try:
        while loader.check_event():
            ev = loader.get_event()
            if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append([ev.anchor, 1])
                if len(stack) - 1 > MAX_DEPTH:
                    raise _too_deep(name, f":{ev.start_mark.line + 1}")
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, n = stack.pop()
                if anchor is not None:
                    sizes[anchor] = n
                stack[-1][1] += n
            elif isinstance(ev, yaml.ScalarEvent):
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
                stack[-1][1] += 1
            elif isinstance(ev, yaml.AliasEvent):
                stack[-1][1] += sizes.get(ev.anchor, 1)
                if sum(n for _, n in stack) > MAX_VALUES:
                    raise file_error(f"{name}:{ev.start_mark.line + 1}: anchors/aliases expand the file past "
                                     f"{MAX_VALUES:,} values (a 'billion laughs'?); a profiler config is a few "
                                     "dozen values: refer to anchors less, or write the values out")
    except yaml.YAMLError as e:
        # libyaml as bundled with PyYAML 6.0.4 stops deep flow nesting in its scanner, before any of the events
        # above (its own bound, about 1,000 levels); older releases leave it to the walk. Same answer either way.
        if "nesting depth" not in str(e):
            raise
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        raise _too_deep(name, f":{mark.line + 1}" if mark is not None else "") from None
    finally:
        loader.dispose()


def _yaml_error(name: str, e: Exception) -> ConfigFileError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{name}:{mark.line + 1}" if mark is not None else name
    problem = getattr(e, "problem", None) or (str(e).splitlines() or ["unreadable YAML"])[0]
    text = f"{where}: not a valid YAML config ({cut(str(problem), 160)})"
    if isinstance(e, yaml.constructor.ConstructorError) and "tag" in str(problem):
        text += ("; tags such as !!python/object are not allowed: config files are read with yaml's safe loader, "
                 "which builds only mappings, lists, strings and numbers")
    else:
        text += "; fix the YAML at that line"
    return file_error(text)


# ---- objects -----------------------------------------------------------------------------------------------
def is_omegaconf(obj: Any) -> bool:
    return type(obj).__module__.startswith("omegaconf")


def to_plain(cfg: Any, *, resolve: bool = False) -> Any:
    """A mapping, an OmegaConf config, an argparse Namespace or a dataclass, as plain dicts and lists (lists
    and strings are returned as they are; None is ``{}``). ``resolve``: OmegaConf resolves the interpolations
    itself (the job's own config, in its own process); otherwise they are left for the dialects' resolver."""
    if cfg is None:
        return {}
    if is_omegaconf(cfg):
        return _omegaconf_container(cfg, resolve)
    if isinstance(cfg, argparse.Namespace):
        return dict(vars(cfg))
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, Mapping):
        return {k: to_plain(v, resolve=resolve) if _is_object(v) else v for k, v in cfg.items()}
    return cfg


def _omegaconf_container(cfg: Any, resolve: bool) -> Any:
    # Imported here: omegaconf is an optional extra, and only an OmegaConf object (so it is installed) comes here.
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=resolve)
    except OmegaConfBaseException as e:  # not a ValueError: a bad interpolation would be a traceback
        raise error(f"the OmegaConf config cannot be read ({cut(str(e).splitlines()[0], 160)}); "
                    "fix that interpolation or write the value itself") from None


def _is_object(v: Any) -> bool:
    return isinstance(v, (Mapping, argparse.Namespace)) or is_omegaconf(v)


def select(data: Any, section: str) -> Any:
    """The part of ``data`` at dotted ``section``; one ConfigError naming the first missing part and what the
    level above it holds."""
    cur = data
    done: list[str] = []
    for part in section.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            where = ".".join(done) or "the top level"
            keys = cut(", ".join(map(str, list(cur)[:12])), 200) if isinstance(cur, Mapping) else type(cur).__name__
            raise error(f"section {show(section)} not found: no {show(part)} under {cut(where, 80)} (it has: {keys}); "
                        "check the dotted path")
        cur = cur[part]
        done.append(part)
    return cur
