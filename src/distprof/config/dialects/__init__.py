"""Other frameworks' profiler configs, as distprof configs: ``translate("verl", cfg)``.

Each dialect module reads the config its framework's users already write (verl's ``global_profiler`` and per-role
``profiler`` sections, RLinf's ``cluster.profiling``, slime's flags ...) with that framework's defaults and
semantics, and writes the distprof fields; :class:`~distprof.config.dialects.translation.Translation` keeps the mapping
field by field, what was dropped and why (a key the dialect does not know is dropped as ``unknown``, never
silently), every error at once, and warnings for a config that captures nothing. ``distprof validate FILE --dialect
NAME`` prints it; ``ProfilerConfig.from_dialect`` raises one ConfigError listing every error, and logs each
dropped key (a warning for an unknown one).
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.source import resolve_interpolations
from distprof.config.dialects.translation import Builder, ConfigClass, Dropped, Mapped, Translation, finish
from distprof.config.errors import MISSING, ConfigFileError, Problem, short
from distprof.config.load import check_bounded, load_file, select, to_plain

__all__ = [
    "DIALECTS",
    "NATIVE",
    "ConfigFileError",
    "Dropped",
    "Mapped",
    "Problem",
    "Translation",
    "guess",
    "load_file",
    "to_config",
    "translate",
]

logger = logging.getLogger(__name__)

# The dialect names (DESIGN.md), each a module of this package with translate(builder) and looks_like(data).
DIALECTS = ("verl", "skyrl", "slime", "swift", "rlinf", "torchtitan", "nemo_rl")
NATIVE = "distprof"  # a distprof config itself, validated the same way (``distprof validate`` without --dialect)
_ALIASES = {"ms_swift": "swift", "nemorl": "nemo_rl", "nemo": "nemo_rl", "sky_rl": "skyrl"}


def _module(name: Any) -> tuple[str, Any]:
    key = str(name).strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key == NATIVE:
        return key, importlib.import_module(".native", __name__)
    if key not in DIALECTS:
        close = difflib.get_close_matches(key, DIALECTS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"dialect {name!r} is unknown; choose one of {', '.join(DIALECTS)}.{hint}")
    return key, importlib.import_module(f".{key}", __name__)


def translate(name: str, cfg: Any, section: str | None = None, *, config: ConfigClass,
              env: Mapping[str, str] | None = None) -> Translation:
    """Translate ``cfg`` (a mapping, an OmegaConf config, an argparse Namespace, or, for flag-driven frameworks,
    a list of command-line tokens) written for framework ``name`` into a distprof config.

    ``section`` is a dotted path to the part of ``cfg`` that holds the framework's config, when it is nested
    (interpolations such as ``${global_profiler.tool}`` are still resolved from the top). ``env`` holds the
    framework's environment variables (``SLIME_PROFILE_*``, ``NRL_NSYS_*``); default ``os.environ``. ``config`` is
    the config class that validates the result (``ProfilerConfig``: passed in, so that the dialects never import the
    model that calls them).
    Never raises for a bad config: read ``.errors`` (or call ``.raise_for_errors()``).
    """
    key, module = _module(name)
    try:
        data = to_plain(cfg)
        if isinstance(data, (Mapping, list)):
            check_bounded(data, f"the {key} config")
            data = resolve_interpolations(data)
    except RecursionError:  # a self-referencing or absurdly deep object: no config nests like that
        raise ValueError(f"the {key} config nests too deep (or refers to itself); a profiler config is a few "
                         "levels deep") from None
    b = Builder(key, data, os.environ if env is None else env)
    if section:
        try:
            b.data = select(data, section)
        except ValueError as e:
            b.error("section", section, str(e))
            return finish(b, section, config)
    module.translate(b)
    t = finish(b, section, config)
    if t.errors and key == NATIVE:
        hint = guess(b.data)
        if hint:  # first: the rest are this file's keys refused as distprof settings
            t.errors.insert(0, Problem.about("dialect", MISSING, f"this looks like a {hint} config, not a distprof "
                                                                 "one; "
                                                           f"validate it with --dialect {hint}"))
    return t



def to_config(name: str, cfg: Any, section: str | None = None, *, config: ConfigClass) -> Any:
    """The ProfilerConfig for ``cfg``; one ConfigError listing every error. Each dropped field is logged, one line
    naming its dotted key: a key the dialect does not know as a warning (it may be a typo), a field distprof
    knows but does not honour at INFO; the translation's warnings as warnings."""
    t = translate(name, cfg, section, config=config)
    t.raise_for_errors()
    for d in t.dropped:
        level = logging.WARNING if d.unknown else logging.INFO
        logger.log(level, "distprof: %s config: %s=%s is not honoured: %s", t.dialect, d.source, short(d.value),
                   d.reason)
    for w in t.warnings:
        logger.warning("distprof: %s config: %s", t.dialect, w)
    return t.profiler_config


def guess(data: Any) -> str | None:
    """The dialect ``data`` looks written for, if any (for a hint when it fails as a distprof config)."""
    if not isinstance(data, Mapping):
        return None
    for key in DIALECTS:
        if importlib.import_module(f".{key}", __name__).looks_like(data):
            return key
    return None
