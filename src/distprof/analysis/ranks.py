"""From files to ranks: which files speak for which (role, rank), and which claims conflict.

A rank may have several files (several capture windows, a resumed run): they all count. Two files that
claim the same role and rank but cannot both be that rank (they overlap in time, or both hold the same
step) come from different jobs, or are a copy: the first by path is used, the other is reported as a
conflict (``conflicts``), never silently merged or dropped.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

__all__ = ["resolve", "group", "add", "summed", "runs", "role_of", "unranked_label"]


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


def unranked_label(path: str) -> str:
    """How a file whose rank is unknown is named wherever ranks are listed: ``? (folder/file)``.

    Each such file stands for a rank of its own: two rank-less files are never merged into one "rank ?"
    (they may be different ranks, or different jobs). The folder is kept because copies of one job's
    files from several hosts often share a file name."""
    tail = "/".join(path.replace("\\", "/").rstrip("/").split("/")[-2:])
    return f"? ({tail})"


RUN_GAP_S = 60.0  # disjoint traced spans this far apart are different runs, not clock skew


def runs(infos: Iterable[Any]) -> tuple[dict[tuple[str, int], str | None], list[str]]:
    """Which ranks of each role were traced together: ``((role, rank) -> the role to report it under, warnings)``.

    The ranks of one job are traced at the same time (they wait for each other in every collective), so
    ranks whose traced time spans lie more than :data:`RUN_GAP_S` apart belong to different runs (a folder
    holding rank 1 of one job and rank 3 of another, taken days apart). Spans closer than that (clocks of
    different hosts disagree by up to a few hundred ms without NTP), directly or through other ranks, form
    one run. A role with several runs gets a warning, and its ranks are reported as ``"{role} (run
    K)"``, so no analysis matches or compares ranks across runs. A rank's span is that of all its files.
    """
    spans: dict[tuple[str, int], list[float]] = {}
    for info in infos:
        if info.rank is None or info.start_us is None:
            continue
        key = (info.role or "", info.rank)
        lo, hi = spans.get(key, (info.start_us, info.end_us))
        spans[key] = [min(lo, info.start_us), max(hi, info.end_us)]
    labels: dict[tuple[str, int], str | None] = {}
    warnings = []
    for role in sorted({r for r, _ in spans}):
        keys = sorted((k for k in spans if k[0] == role), key=lambda k: (spans[k][0], k[1]))
        groups: list[list[tuple[str, int]]] = []
        reach = -float("inf")
        for k in keys:
            lo, hi = spans[k]
            if not groups or lo > reach + RUN_GAP_S * 1e6:
                groups.append([])
            groups[-1].append(k)
            reach = max(reach, hi)
        for n, g in enumerate(groups):
            for k in g:
                labels[k] = (f"{role} (run {n + 1})" if role else f"(run {n + 1})") if len(groups) > 1 else (role or None)
        if len(groups) > 1:
            gap = min(spans[groups[i + 1][0]][0] - max(spans[k][1] for k in groups[i]) for i in range(len(groups) - 1))
            who = "; ".join(f"run {n + 1}: ranks " + ",".join(str(k[1]) for k in sorted(g)) for n, g in enumerate(groups))
            warnings.append(f"{'role ' + repr(role) + ': ' if role else ''}ranks traced at different times, at least "
                            f"{_duration(gap / 1e6)} apart, are different runs and never matched as one job ({who})")
    return labels, warnings


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.3f} s"


def role_of(labels: dict[tuple[str, int], str | None], info: Any) -> str | None:
    """The role a file's rank is reported under (see :func:`runs`)."""
    if info.rank is None:
        return info.role
    return labels.get((info.role or "", info.rank), info.role)


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
