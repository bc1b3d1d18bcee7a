"""From files to ranks: which files speak for which (role, rank), and which claims conflict.

A rank may have several files (several capture windows, a resumed run): they all count. Two files that
claim the same role and rank but cannot both be that rank (they overlap in time, or both hold the same
step) come from different jobs, or are a copy: the first by path is used, the other is reported as a
conflict (``conflicts``), never silently merged or dropped.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

__all__ = ["resolve", "group", "add", "summed"]


def resolve(results: list) -> tuple[list, list[dict[str, Any]]]:
    """``results`` (objects with ``.info``, in path order) -> (kept, conflicts)."""
    kept, conflicts = [], []
    by_rank: dict[tuple[str, int], list] = defaultdict(list)
    for r in results:
        info = r.info
        if info.rank is None:
            kept.append(r)
            continue
        key = (info.role or "", info.rank)
        reason, other = None, None
        for prev in by_rank[key]:
            p = prev.info
            if info.start_us is not None and p.start_us is not None and \
                    min(info.end_us, p.end_us) > max(info.start_us, p.start_us):
                reason, other = "overlaps it in time", p.path
            elif set(info.steps) & set(p.steps):
                reason, other = f"holds the same steps {sorted(set(info.steps) & set(p.steps))}", p.path
            if reason:
                break
        if reason:
            conflicts.append({"role": info.role, "rank": info.rank, "path": info.path, "kept": other,
                              "reason": f"claims {info.role + ' ' if info.role else ''}rank {info.rank} but {reason}; "
                                        f"using {other}"})
            continue
        by_rank[key].append(r)
        kept.append(r)
    return kept, conflicts


def group(pairs: Iterable[tuple[Any, Any]]) -> list[tuple[Any, list]]:
    """(info, part) pairs -> [(first info, [parts of that rank])], by role then rank (unranked files last,
    one group each)."""
    groups: dict[Any, list] = {}
    firsts: dict[Any, Any] = {}
    for info, part in pairs:
        key = (info.role or "", info.rank) if info.rank is not None else ("\uffff", info.path)
        if key not in groups:
            groups[key], firsts[key] = [], info
        groups[key].append(part)
    order = sorted(groups, key=lambda k: (k[0], k[1] if isinstance(k[1], int) else -1, str(k[1])))
    return [(firsts[k], groups[k]) for k in order]


def summed(pairs: Iterable[tuple[Any, dict[str, Any]]], keys: tuple[str, ...]) -> list[tuple[Any, dict[str, Any]]]:
    """Per rank (as :func:`group` orders them): ``keys`` of its parts summed with :func:`add`."""
    out = []
    for info, parts in group(pairs):
        acc: dict[str, Any] = dict.fromkeys(keys)
        for p in parts:
            for k in keys:
                acc[k] = add(acc[k], p[k])
        out.append((info, acc))
    return out


def add(a: Any, b: Any) -> Any:
    """Sum two figure dicts key by key (numbers add, dicts recurse, None is nothing)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: add(a.get(k), b.get(k)) for k in {**a, **b}}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a + b
    return a
