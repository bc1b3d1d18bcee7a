"""How big the parts of a profiler config may be, and how a path setting must look (docs/integrations.md,
"Bring your framework's config", Limits).

A profiler config is a few dozen values; these bounds refuse a mistake or an attack before anything walks it
pair by pair (roles are matched against ``per_role`` globs name by name: 10,000 of each took minutes). Each
refusal is a ValueError naming the field, its size and the fix. Pure: imports nothing of distprof.
"""

from __future__ import annotations

import os
from collections.abc import Sized
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_DIGITS", "MAX_FILE_BYTES", "MAX_ROLES", "MAX_STEPS", "MAX_VALUES", "PATH_FIX",
           "check_roles", "path_text"]

MAX_STEPS = 1_000_000  # an explicit step list longer than this is a typo, not a plan
MAX_DIGITS = 18  # a step or rank with more digits is a typo (and int() of 4,300+ digits raises)
# Untrusted input bounds: a profiler config is a few dozen values. Past these it is a mistake or an attack
# (a YAML "billion laughs" is 358 bytes that expand to 10^9 values), refused before anything walks it.
MAX_VALUES = 2 * MAX_STEPS  # values visited, counting every alias expansion
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_FILE_BYTES = 4 << 20  # a config file's size
MAX_ROLES = 64  # names or globs in roles, entries in per_role (a dialect's worker groups, targets, patterns)
PATH_FIX = "write it as a string, e.g. runs/exp1/profile or s3://bucket/exp1"


def check_roles(field: str, value: Sized, what: str = "role names") -> None:
    """Refuse ``value`` (a roles list, a per_role mapping) holding more than MAX_ROLES entries."""
    n = len(value)
    if n > MAX_ROLES:
        raise ValueError(f"{field} holds {n:,} {what}, more than the {MAX_ROLES} a config may have; a job has a few "
                         "roles: name them, or cover many with a glob such as 'rollout*'")


def path_text(value: Any) -> str | None:
    """``value`` as a path or URL string (``os.PathLike`` accepted), or None when it is anything else (a list or
    mapping would otherwise become a folder named ``{'a': {'b': 1}}``)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return value if isinstance(value, str) else None
