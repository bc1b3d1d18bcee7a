"""From files to ranks: which files speak for which (role, rank), which run each belongs to, and which claims
conflict.

A folder may hold files of several jobs that share rank numbers (a reused ``tensorboard_trace_handler``
folder, traces collected from several places). A run's identity comes from what the files say
(:func:`file_facts`: world size and backend from ``distributedInfo``, the run directory, the process that
wrote them, the time they were traced); files of different runs are never one run (:func:`assign_runs`), and
each run is analysed on its own.

Within a run a rank may have several files (several capture windows): they all count. Two files that claim
the same role and rank but cannot both be that rank (they overlap in time, or both hold the same step) are a
copy, or two writers of one rank: the first by path is used, the other is reported as a conflict
(``conflicts``), never silently merged or dropped.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = [
    "RUN_GAP_S",
    "add",
    "assign_runs",
    "file_facts",
    "group",
    "resolve",
    "role_of",
    "runs",
    "summed",
    "unranked_label",
]


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

# What a file says about the job that wrote it and that no two files of one job disagree on (None: not said).
_FIXED = (("world_size", "world size"), ("backend", "backend"))


def file_facts(distributed_info: Any, window: Any, run_dir: str | None, path: str) -> dict[str, Any]:
    """What one file says about the job that wrote it (kept in ``FileInfo.run``): ``world_size`` and
    ``backend`` (Kineto's ``distributedInfo``; the world size else the manifest's), ``run_dir`` (the distprof
    run directory holding it, relative to the path analysed), ``process`` (``host:pid N``, from the manifest
    or a ``tensorboard_trace_handler`` file name: one process's files are one run whenever they were traced)."""
    from distprof.trace.listing import process_from_name

    info = distributed_info if isinstance(distributed_info, dict) else {}
    ws = info.get("world_size")
    if not (type(ws) is int and ws > 0):
        ws = getattr(window, "world_size", None) if window is not None else None
        ws = ws if type(ws) is int and ws > 0 else None
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    process = None
    if window is not None and getattr(window, "pid", None) is not None:
        process = f"{window.host or '?'}:pid {window.pid}"
    return {"world_size": ws, "backend": backend[:40] if backend else None, "run_dir": run_dir,
            "process": process or process_from_name(path)}


class _Sets:
    """Union-find over file indices."""

    def __init__(self, n: int):
        self.up = list(range(n))

    def find(self, i: int) -> int:
        while self.up[i] != i:
            self.up[i] = self.up[self.up[i]]
            i = self.up[i]
        return i

    def join(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.up[max(a, b)] = min(a, b)


def _facts(info: Any) -> dict[str, Any]:
    return info.run if isinstance(getattr(info, "run", None), dict) else {"world_size": info.world_size}


def _key(info: Any) -> tuple:
    f = _facts(info)
    return tuple(f.get(k) for k, _ in _FIXED)


def _partition(files: list, same_rank: bool) -> list[list]:
    """The ranked files of one role split into runs (lists of files, the earliest run first).

    Files that disagree on a fixed fact (world size, backend) are never one run. Among the others, files are
    one run when linked, directly or through other files: traced within :data:`RUN_GAP_S` of each other in the
    same run directory (ranks of one job wait for each other in every collective, so they are traced
    together; two run directories traced at the same time are two jobs), written by the same process (a copy
    of a run directory is the same run: its files' conflicts are then reported), or (``same_rank``: when the
    caller cannot tell a rank's files apart) of the same rank. A rank traced at two times by processes nothing
    ties together is two runs."""
    sets = _Sets(len(files))
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i, info in enumerate(files):
        by_key[_key(info)].append(i)
    for idx in by_key.values():
        _link_in_time(files, idx, sets)
        _link_by_writer(files, idx, sets, same_rank)
        _join_lone(files, idx, sets)
    groups: dict[int, list] = defaultdict(list)
    for i, info in enumerate(files):
        groups[sets.find(i)].append(info)
    return sorted(groups.values(), key=lambda g: (min((f.start_us for f in g if f.start_us is not None),
                                                      default=float("inf")), min(f.rank for f in g)))


def _link_in_time(files: list, idx: list[int], sets: _Sets) -> None:
    """Join the files ``idx`` (of one fixed key) traced within :data:`RUN_GAP_S` of each other in one run
    directory."""
    by_dir: dict[Any, list[int]] = defaultdict(list)
    for i in idx:
        if files[i].start_us is not None:
            by_dir[_facts(files[i]).get("run_dir")].append(i)
    for timed in by_dir.values():
        timed.sort(key=lambda i: files[i].start_us)
        anchor, reach = None, -float("inf")
        for i in timed:
            if anchor is None or files[i].start_us > reach + RUN_GAP_S * 1e6:
                anchor = i
            else:
                sets.join(anchor, i)
            reach = max(reach, files[i].end_us)


def _link_by_writer(files: list, idx: list[int], sets: _Sets, same_rank: bool) -> None:
    """Join the files ``idx`` written by one process (and, ``same_rank``, of one rank)."""
    anchors: dict[Any, list[int]] = defaultdict(list)
    for i in idx:
        tags = [("process", _facts(files[i]).get("process"))]
        if same_rank:
            tags.append(("rank", files[i].rank))
        for tag in tags:
            if tag[1] is None:
                continue
            # One process never runs a step twice at two times: a pid that holds the same step again, traced
            # elsewhere in time, is another process that got the same pid (containers start their pids alike).
            j = next((a for a in anchors[tag] if tag[0] == "rank" or not _replayed(files[a], files[i])), None)
            if j is None:
                anchors[tag].append(i)
            else:
                sets.join(j, i)


def _join_lone(files: list, idx: list[int], sets: _Sets) -> None:
    """A file without a span (no events) that nothing else ties to a run joins the first of its kind."""
    size = Counter(sets.find(i) for i in idx)
    lone = {i for i in idx if files[i].start_us is None and size[sets.find(i)] == 1}
    rest = [i for i in idx if i not in lone]
    for i in lone:
        if rest:
            sets.join(rest[0], i)


def _replayed(a: Any, b: Any) -> bool:
    """Two files holding a common step at disjoint times (a copy holds it at the same time)."""
    if a.start_us is None or b.start_us is None or not set(a.steps) & set(b.steps):
        return False
    return a.end_us < b.start_us or b.end_us < a.start_us


def _span(g: list) -> tuple[float, float] | None:
    starts = [f.start_us for f in g if f.start_us is not None]
    return (min(starts), max(f.end_us for f in g if f.end_us is not None)) if starts else None


def _why(role: str, groups: list[list]) -> str:
    """One warning: which ranks each run holds, and what tells the runs apart."""
    who = "; ".join(f"run {n + 1}: ranks " + ",".join(str(r) for r in sorted({f.rank for f in g}))
                    for n, g in enumerate(groups))
    keys = [_key(g[0]) for g in groups]
    dirs = [sorted({str(_facts(f).get("run_dir")) for f in g}) for g in groups]
    reasons = [*_fixed_reasons(keys), *_dir_reasons(dirs), *_time_reasons(groups, keys, dirs)]
    return (f"{'role ' + repr(role) + ': ' if role else ''}ranks of {len(groups)} different runs, analysed apart and "
            f"never matched as one job ({who}): {'; '.join(reasons) or 'nothing ties them together'}")


def _fixed_reasons(keys: list[tuple]) -> list[str]:
    """The fixed facts (world size, backend) the runs disagree on."""
    reasons = []
    for k, (_, what) in enumerate(_FIXED):
        seen = list(dict.fromkeys(key[k] for key in keys))
        if len(seen) > 1:
            shown = ["unknown" if v is None else "the path itself" if v == "" else str(v) for v in seen]
            reasons.append(f"{what} {' vs '.join(shown)}")
    return reasons


def _dir_reasons(dirs: list[list[str]]) -> list[str]:
    """The run directories, when the runs' differ."""
    if len({tuple(d) for d in dirs}) <= 1:
        return []
    shown = list(dict.fromkeys("the path itself" if d == "" else "none" if d == "None" else d
                               for ds in dirs for d in ds))
    return [f"run directory {' vs '.join(shown)}"]


def _time_reasons(groups: list[list], keys: list[tuple], dirs: list[list[str]]) -> list[str]:
    """How far apart in time the runs were traced: between runs that only time tells apart, else between all
    (when every gap is over :data:`RUN_GAP_S`)."""
    spans = [_span(g) for g in groups]
    same = [(a, b) for i, a in enumerate(spans) for j, b in enumerate(spans)
            if i < j and keys[i] == keys[j] and dirs[i] == dirs[j] and a and b]
    if same:  # runs that only time tells apart
        gap = min(max(b[0] - a[1], a[0] - b[1]) for a, b in same)
        return [f"traced at least {_duration(max(gap, 0.0) / 1e6)} apart"]
    timed = sorted(s for s in spans if s)
    gaps: list[float] = []
    reach = -float("inf")
    for lo, hi in timed:
        if reach > -float("inf"):
            gaps.append(lo - reach)
        reach = max(reach, hi)
    if gaps and min(gaps) > RUN_GAP_S * 1e6:
        return [f"traced at least {_duration(min(gaps) / 1e6)} apart"]
    return []


def assign_runs(infos: Iterable[Any]) -> list[str]:
    """Split each role's files into runs (see :func:`_partition`) and report a role with several as ``"{role} (run
    K)"`` (``"(run K)"`` without a role), by setting each file's ``role``: from then on every analysis keeps the
    runs apart (a rank of one run is never matched, compared or summed with a rank of another), and
    :func:`runs` leaves them as they are. Files need ``FileInfo.run`` (:func:`file_facts`); unranked files stand
    alone already and are left as they are. Returns one warning per role split, saying why."""
    by_role: dict[str, list] = defaultdict(list)
    for info in infos:
        if info.rank is not None:
            by_role[info.role or ""].append(info)
    warnings = []
    for role in sorted(by_role):
        groups = _partition(by_role[role], same_rank=False)
        for n, g in enumerate(groups):
            for info in g:
                if len(groups) > 1:
                    info.role = f"{role} (run {n + 1})" if role else f"(run {n + 1})"
                info.run = {**_facts(info), "assigned": True}
        if len(groups) > 1:
            warnings.append(_why(role, groups))
    return warnings


def runs(infos: Iterable[Any]) -> tuple[dict[tuple[str, int], str | None], list[str]]:
    """Which ranks of each role were traced together: ``((role, rank) -> the role to report it under, warnings)``.

    Files read by :mod:`.analyze` were split into runs when read (:func:`assign_runs`): nothing to do. Others
    (built by hand) are split here by what their ``FileInfo`` says (world size, time span; a rank's files are
    one run), and a role with several runs gets a warning and its ranks are reported as ``"{role} (run K)"``,
    so no analysis matches or compares ranks across runs.
    """
    infos = [i for i in infos if i.rank is not None]
    if all((getattr(i, "run", None) or {}).get("assigned") for i in infos):
        return {}, []
    by_role: dict[str, list] = defaultdict(list)
    for info in infos:
        by_role[info.role or ""].append(info)
    labels: dict[tuple[str, int], str | None] = {}
    warnings = []
    for role in sorted(by_role):
        groups = _partition(by_role[role], same_rank=True)
        for n, g in enumerate(groups):
            for info in g:
                labels[(role, info.rank)] = (f"{role} (run {n + 1})" if role else f"(run {n + 1})") \
                    if len(groups) > 1 else (role or None)
        if len(groups) > 1:
            warnings.append(_why(role, groups))
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
