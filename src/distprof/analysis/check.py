"""Is a run directory complete and readable? What is missing or broken, and why?

Expected windows come from the config recorded in run.json (or a role's own, in ``{role}/role.json``) and each
role's world size: every selected rank of every role that captured must have every window of the plan that the
run reached. The manifests say what was captured, and the check reads them truthfully:

- a window captured by a process resumed in its middle (expected 3-5, line ``[4, 5]``) is ``incomplete``
  ("resumed at step 4: steps 3-3 were not captured"), its file listed and checked; a window split between a
  process that stopped and the one that resumed is whole;
- a window cut short (``complete: false``) is ``incomplete`` with its cause (``stopped_by``; the memory guard's
  numbers); windows after the last step the run reached (over every rank of the role) are ``not_reached``,
  which is not a failure, while a window the run did reach but a rank lacks is ``missing``;
- on-demand windows (``trigger``) are expected by their own line; a window whose upload failed is
  ``not_uploaded`` (its files stayed on the host, named); two processes writing one (role, rank) at the same
  time are a problem, one after the other a resumed run (a note).

Every file named by a manifest must lie in its rank folder, have its recorded size and decode; traces are
streamed through the analysis reader (bounded memory, whatever their size or compression). The directory is
read only through :class:`~.view.RunView` (local path or fsspec URL): nothing outside it is read or followed.
Nothing a run directory holds raises: a file of the wrong shape is reported, in one line.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from distprof.analysis.checkfile import check_file, process_outputs, ranks_without_output, short
from distprof.analysis.runview import RunView, ViewError
from distprof.config.plan import FOREVER, Window
from distprof.rundir.layout import (
    COLLECT_JSON,
    MANIFEST,
    PROCESS_BACKENDS,
    RANK_FILES,
    RAY_TIMELINE,
    ROLE_JSON,
    RUN_JSON,
    TMP_PREFIX,
    rank_dir,
    rank_of_dir,
    rank_of_process_output,
    sanitize_role,
)
from distprof.rundir.manifest import LIMIT_STOPS, MANIFEST_LIMIT, OOM, WindowRecord, read_manifest, safe_relpath

logger = logging.getLogger(__name__)

__all__ = ["STATUSES", "CheckResult", "Item", "check_run"]

# status -> (what it means, does it fail the check). docs/run-directory.md's table says the same.
STATUSES: dict[str, tuple[str, bool]] = {
    "ok": ("the file is there, has the size its manifest line records and decodes", False),
    "unlisted": ("a file in a rank folder that no manifest line names (another run or backend?)", False),
    "not_reached": ("a planned window after the last step the run reached", False),
    "missing": ("a window the run reached (or a file a manifest names) is not there", True),
    "broken": ("wrong size, does not decode, a manifest line or JSON file of the wrong shape, or a path that "
               "leaves its folder", True),
    "incomplete": ("the window holds fewer steps than planned: cut short (cause given) or resumed in its middle",
                   True),
    "not_uploaded": ("the window was captured but its upload failed: the files stayed on the host named", True),
    "unfinished": ("a temporary file left by a write that never finished", True),
}

SMALL_JSON_LIMIT = 16 << 20  # run.json / role.json are a few KB
MAX_RANKS = 100_000  # ranks checked one by one (a world size beyond this is not believed)
MAX_WINDOWS = 10_000  # expected windows (or discrete steps) per role
_COLLAPSE = 20  # a rank with no files at all: one item instead of one per window past this many windows


@dataclass
class Item:
    role: str
    rank: int | None
    steps: list[int] | None
    status: str  # a key of STATUSES
    file: str | None = None
    detail: str = ""


@dataclass
class CheckResult:
    run_dir: str
    roles: list[dict[str, Any]] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be judged, or is worth knowing (not a problem)
    error: str | None = None  # the path is not a run directory or cannot be read (the CLI exits 2)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems and not any(STATUSES[i.status][1] for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "ok": self.ok, "error": self.error, "roles": self.roles,
                "items": [asdict(i) for i in self.items], "problems": self.problems, "notes": self.notes}

    def fail(self, message: str) -> CheckResult:
        self.error = message
        self.problems.append(message)
        return self


@dataclass
class _Role:
    name: str
    config: Any
    world: int
    backend: str
    ranks: list[int] = field(default_factory=list)
    records: dict[int, list[WindowRecord]] = field(default_factory=dict)


def check_run(run_dir: str) -> CheckResult:
    """Check the run directory at ``run_dir`` (a local path or an fsspec URL). Never raises for what it holds."""
    from distprof.config.model import ProfilerConfig

    view = RunView(run_dir)
    res = CheckResult(run_dir=view.where)
    try:
        kind = view.root_kind()
    except ViewError as e:
        return res.fail(str(e))
    if kind == "missing":
        return res.fail(f"{view.where}: no such file or directory")
    if kind == "file":
        return res.fail(f"{view.where} is a file, not a run directory")
    if kind != "dir":
        return res.fail(f"{view.where} is {kind}, not a run directory")
    run, why = _read_json(view, RUN_JSON)
    if run is None:
        if why == "missing":
            return res.fail(f"{view.where} is not a distprof run directory: {RUN_JSON} is missing")
        return res.fail(f"{view.url(RUN_JSON)}: {why}")
    try:
        config = ProfilerConfig.from_saved(run["config"])
    except KeyError:
        return res.fail(f"{view.url(RUN_JSON)}: has no config")
    except (ValueError, TypeError) as e:
        return res.fail(f"{view.url(RUN_JSON)}: its config cannot be used ({short(e)})")

    tree = {rel: (dirs, files) for rel, dirs, files in view.walk()}
    read = [_read_role(view, tree, name, config, run, res) for name in _roles(tree)]
    roles = [r for r in read if r is not None]
    if not res.roles:
        res.problems.append("no role captured anything (no role directories)")
    run_reached = max((_reached(r) for r in roles), default=-1)
    listed: set[str] = set()
    for role in roles:
        _check_role(view, tree, role, run_reached, listed, res)
    for rel_dir, (dirs, files) in sorted(tree.items()):
        for n in files + dirs:
            if n.startswith(TMP_PREFIX):
                rel = posixpath.join(rel_dir, n) if rel_dir else n
                res.items.append(Item(role=rel.split("/")[0], rank=None, steps=None, status="unfinished", file=rel,
                                      detail="a write that never finished (temporary file left behind)"))
    for rel, why in view.refused:
        if rel not in listed:  # a refused file a manifest names is already a broken item
            res.notes.append(f"{rel}: {why}")
    _explain_missing(view, res)
    return res


def _explain_missing(view: RunView, res: CheckResult) -> None:
    """Missing windows of ranks whose node the last ``distprof.integrations.ray.collect`` could not reach (its
    ``collect.json``): say so, naming the node. The file is untrusted like the rest: anything of the wrong shape is
    ignored."""
    note, why = _read_json(view, COLLECT_JSON)
    if note is None:
        if why != "missing":
            res.notes.append(f"{COLLECT_JSON}: {why}")
        return
    lost: dict[tuple[str, int | None], str] = {}
    nodes = note.get("unreachable_nodes")
    for u in nodes if isinstance(nodes, list) else []:
        if not isinstance(u, dict) or not isinstance(u.get("ranks"), list):
            continue
        node = str(u.get("node_id") or "?")[:12]
        where = f"node {node}" + (f" ({str(u['address'])[:64]})" if u.get("address") else "")
        because = f": {str(u['error'])[:200]}" if u.get("error") else ""
        for r in u["ranks"]:
            if isinstance(r, dict) and isinstance(r.get("role"), str) and type(r.get("rank")) is int:
                try:
                    role = sanitize_role(r["role"])
                except ValueError:
                    continue
                lost.setdefault((role, r["rank"]), f"not collected: {where} was unreachable{because}")
    for item in res.items:
        if item.status == "missing" and (item.role, item.rank) in lost:
            why = lost[(item.role, item.rank)]
            item.detail = f"{item.detail}; {why}" if item.detail else why


# ---- reading ------------------------------------------------------------------------------------------------
def _read_json(view: RunView, rel: str) -> tuple[dict[str, Any] | None, str]:
    """A small JSON object file: (object, "") or (None, why); why is "missing" when it is not there."""
    try:
        data = view.read_small(rel, SMALL_JSON_LIMIT + 1)
    except ViewError as e:
        return None, str(e).split(": ", 1)[-1]
    if data is None:
        return None, "missing"
    if len(data) > SMALL_JSON_LIMIT:
        return None, f"larger than {SMALL_JSON_LIMIT >> 20} MB; not read"
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
        return None, f"not valid JSON ({short(e)})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object (it is {type(obj).__name__})"
    return obj, ""


def _roles(tree: dict[str, tuple[list[str], list[str]]]) -> list[str]:
    """Role folders: those holding role.json, or a rank folder, at any depth (roles may nest)."""
    out = []
    for rel, (dirs, files) in tree.items():
        if rel and not any(p.startswith(TMP_PREFIX) for p in rel.split("/")) and (
                ROLE_JSON in files or any(rank_of_dir(x) is not None for x in dirs)):
            out.append(rel)
    return sorted(out)


def _pos_int(v: Any) -> int | None:
    return v if type(v) is int and v >= 1 else None


def _read_role(view: RunView, tree, name: str, config: Any, run: dict[str, Any], res: CheckResult) -> _Role | None:
    from distprof.config.model import ProfilerConfig

    rel = f"{name}/{ROLE_JSON}"
    info, why = _read_json(view, rel)
    if info is None:
        info = {}
        if why != "missing":
            res.items.append(Item(name, None, None, "broken", rel, why))
    for where, d in ((rel, info), (RUN_JSON, run)):  # a wrong-typed world size is reported, then not used
        if "world_size" in d and _pos_int(d["world_size"]) is None:
            res.items.append(Item(name, None, None, "broken", where,
                                  f"world_size is {short(repr(d['world_size']))}, not a positive integer; ignored"))
    world = _pos_int(info.get("world_size")) or _pos_int(run.get("world_size")) or 1
    if isinstance(info.get("config"), dict):  # groups may run with their own configs; run.json holds the first's
        try:
            config = ProfilerConfig.from_saved(info["config"])
        except (ValueError, TypeError) as e:
            res.items.append(Item(name, None, None, "broken", rel, f"its config cannot be used ({short(e)})"))
    backend = b if isinstance(b := info.get("backend"), str) else config.backend
    res.roles.append({"role": name, "world_size": world, "backend": backend})
    role = _Role(name, config, world, backend)
    if backend in PROCESS_BACKENDS:
        _check_process_outputs(view, tree, name, backend, res, config, world)
        return None
    role.ranks = _expected_ranks(tree, name, config, info, world, res)
    for r in sorted(set(role.ranks) | set(_ranks_on_disk(tree, name))):
        role.records[r] = _read_manifest(view, name, r, res)
    return role


def _ranks_on_disk(tree, role: str) -> list[int]:
    return sorted(r for d in tree.get(role, ([], []))[0] if (r := rank_of_dir(d)) is not None)


def _expected_ranks(tree, role: str, config: Any, info: dict[str, Any], world: int, res: CheckResult) -> list[int]:
    """The ranks that should have captured: from the rank list, or mesh coordinates and the mesh in role.json.
    Where that cannot be known (per_node: local ranks are not recorded), the ranks that wrote something."""
    why = None
    if isinstance(config.ranks, dict) and isinstance(info.get("mesh"), dict):
        from distprof.config.mesh import RankMesh, selected_ranks

        try:
            m = info["mesh"]
            sel = {k: (v if v == "*" else tuple(v)) for k, v in config.ranks.items()}
            ranks = selected_ranks(sel, RankMesh(tuple(m["names"]), tuple(m["shape"]), tuple(m["ranks"])))
        except (KeyError, TypeError, ValueError) as e:
            why = f"the mesh in {ROLE_JSON} cannot be used ({short(e)})"
    elif isinstance(config.ranks, dict) or config.per_node is not None:
        why = "local ranks (per_node)" if config.per_node is not None else "a mesh not recorded"
    elif world > MAX_RANKS:
        why = f"a world size of {world:,} (more than {MAX_RANKS:,} ranks are not checked one by one)"
    else:
        ranks = list(range(world)) if config.ranks == "all" else list(config.ranks)
    if why is not None:
        on_disk = _ranks_on_disk(tree, role)
        res.notes.append(f"{role}: which ranks should capture depends on {why}; checking the {len(on_disk)} ranks "
                         "that wrote files")
        return on_disk
    return [r for r in ranks if r < world]


def _read_manifest(view: RunView, role: str, rank: int, res: CheckResult) -> list[WindowRecord]:
    rel = f"{rank_dir(role, rank)}/{MANIFEST}"
    try:
        data = view.read_small(rel, MANIFEST_LIMIT)
    except ViewError as e:
        res.items.append(Item(role, rank, None, "broken", rel, str(e).split(": ", 1)[-1]))
        return []
    if data is None:
        return []
    got = read_manifest(data)
    for problem in got.problems[:20]:
        res.items.append(Item(role, rank, None, "broken", rel, f"manifest {problem}"))
    if len(got.problems) > 20:
        res.items.append(Item(role, rank, None, "broken", rel, f"manifest: {len(got.problems) - 20} more bad lines"))
    good = []
    for rec in got.records:
        if rec.first > rec.last:
            res.items.append(Item(role, rank, list(rec.steps), "broken", rel,
                                  f"a manifest line says steps {rec.first}-{rec.last} (first after last)"))
        else:
            good.append(rec)
    return good


def _reached(role: _Role) -> int:
    return max((rec.last for recs in role.records.values() for rec in recs), default=-1)


# ---- expectations ---------------------------------------------------------------------------------------------
def _expected_windows(config: Any, reached: int, res: CheckResult, role: str) -> list[Window]:
    """The plan's windows (for an open-ended schedule: up to the last step reached), at most MAX_WINDOWS."""
    try:
        plan = config.plan()
    except (ValueError, TypeError) as e:  # a recorded config this version cannot plan: judge the files only
        res.notes.append(f"{role}: the recorded plan cannot be used ({short(e)}); only the files listed are checked")
        return []
    if config.steps is not None:
        out = list(plan.windows[:MAX_WINDOWS])
    else:
        count = config.window_count()
        horizon = FOREVER - 1 if count is not None else reached
        out, step = [], 0
        while len(out) < min(MAX_WINDOWS, count if count is not None else MAX_WINDOWS):
            w = plan.next_window(step)
            if w is None or w.end > horizon:
                break
            out.append(w)
            step = w.end + 1
    if len(out) >= MAX_WINDOWS:
        res.notes.append(f"{role}: the plan has more than {MAX_WINDOWS:,} windows; the first {MAX_WINDOWS:,} are "
                         "checked")
    return out


def _check_role(view: RunView, tree, role: _Role, run_reached: int, listed: set[str], res: CheckResult) -> None:
    reached = _reached(role)
    if reached < 0:
        reached = run_reached  # this role recorded nothing: judge by how far the run got
    expected = _expected_windows(role.config, reached, res, role.name)
    if reached < 0 and expected:  # nothing recorded anywhere: its end is unknown, so no window is "not reached"
        res.problems.append(f"{role.name}: nothing was captured (no manifest line in any rank folder)")
        reached = FOREVER
    for rank in sorted(role.records):
        recs = role.records[rank]
        if rank not in role.ranks and not recs:
            continue
        _writers(role.name, rank, recs, res)
        seen: set[str] = set()
        planned = [r for r in recs if r.trigger is None and r.stopped_by != OOM and r.backend != RAY_TIMELINE]
        if rank not in role.ranks:  # files from a rank the config does not select: checked, not expected
            for rec in planned:
                for f, status, why in _files(view, rank_dir(role.name, rank), rec, seen):
                    res.items.append(Item(role.name, rank, list(rec.steps), status, f,
                                          why or "a rank the config does not select"))
        elif role.config.discrete:
            _check_discrete(view, role.name, rank, planned, expected, reached, seen, res)
        else:
            _check_windows(view, role.name, rank, planned, expected, reached, seen, res)
        _check_side_lines(view, role.name, rank, recs, seen, res)
        listed |= seen
        _unlisted(view, tree, role.name, rank, seen, res)


def _check_side_lines(view: RunView, role: str, rank: int, recs: list[WindowRecord], seen: set[str],
                      res: CheckResult) -> None:
    """The rank's lines beside the plan's windows: Ray timelines, OOM snapshots, on-demand windows."""
    rank_rel = rank_dir(role, rank)
    for rec in recs:
        if rec.backend == RAY_TIMELINE:  # the driver's copy of Ray's task timeline, beside its window's trace
            res.items += [Item(role, rank, list(rec.steps), st, f, why or "Ray's task timeline")
                          for f, st, why in _files(view, rank_rel, rec, seen)]
        elif rec.stopped_by == OOM:  # its own line beside its window's: the allocator's state when CUDA ran out
            res.items += [Item(role, rank, list(rec.steps), st, f, why or f"CUDA out-of-memory snapshot, taken "
                               f"in step {rec.last}") for f, st, why in _files(view, rank_rel, rec, seen)]
        elif rec.trigger is not None and not rec.files:  # a rank that saw the request too late: said, not a fault
            res.notes.append(f"{role} rank {rank}: skipped requested steps {rec.first}-{rec.last} "
                             f"(request {rec.trigger}, {rec.stopped_by})")
        elif rec.trigger is not None:
            detail = f"on demand (request {rec.trigger})"
            for f, status, why in _files(view, rank_rel, rec, seen):
                if status == "ok" and not rec.complete:
                    status, why = "incomplete", _cut_detail(rec, None, [])
                res.items.append(Item(role, rank, list(rec.steps), status, f, f"{detail}; {why}" if why else detail))


def _check_windows(view: RunView, role: str, rank: int, recs: list[WindowRecord], expected: list[Window],
                   reached: int, seen: set[str], res: CheckResult) -> None:
    if not recs and len(expected) > _COLLAPSE:
        gone = [w for w in expected if w.start <= reached]
        if gone:
            res.items.append(Item(role, rank, [gone[0].start, gone[-1].end], "missing",
                                  detail=f"no files from this rank ({len(gone)} windows the run reached)"))
        if len(gone) < len(expected):
            later = expected[len(gone)]
            res.items.append(Item(role, rank, [later.start, expected[-1].end], "not_reached",
                                  detail=f"{len(expected) - len(gone)} windows not reached (the run ended at step "
                                         f"{reached})"))
        return
    rank_rel = rank_dir(role, rank)
    used: set[int] = set()
    for w in expected:
        over = sorted((r for r in recs if r.first <= w.end and r.last >= w.start), key=lambda r: (r.first, r.last))
        if not over:
            if w.start > reached:
                res.items.append(Item(role, rank, [w.start, w.end], "not_reached",
                                      detail=f"not reached (the run ended at step {reached})"))
            else:
                res.items.append(Item(role, rank, [w.start, w.end], "missing",
                                      detail="no manifest line for this window"))
            continue
        gaps = _gaps(w, over)
        for rec in over:
            used.add(id(rec))
            _check_window_line(view, role, rank, w, rec, over, gaps, seen, res)
    for rec in recs:  # lines for no window of the plan (the plan changed?): their files are still checked
        if id(rec) not in used:
            for f, status, why in _files(view, rank_rel, rec, seen):
                res.items.append(Item(role, rank, list(rec.steps), status, f,
                                      why or f"steps {rec.first}-{rec.last}: not a window of the plan"))


def _check_window_line(view: RunView, role: str, rank: int, w: Window, rec: WindowRecord, over: list[WindowRecord],
                       gaps: list[tuple[int, int]], seen: set[str], res: CheckResult) -> None:
    """The files of one line covering window ``w`` (``over``: every line covering it), or why it has none."""
    continued = any(o is not rec and rec.first < o.first <= rec.last + 1 for o in over)
    for f, status, why in _files(view, rank_dir(role, rank), rec, seen):
        if status == "ok":
            if gaps or (not rec.complete and not continued):
                status, why = "incomplete", _cut_detail(rec, w, gaps)
            elif (rec.first, rec.last) != (w.start, w.end):
                why = (f"steps {rec.first}-{rec.last} of {w.start}-{w.end}; the rest in another process's "
                       "file (a resumed run)")
            elif len(over) > 1:
                why = "this window was captured more than once (both copies kept)"
        res.items.append(Item(role, rank, [w.start, w.end], status, f, why))
    if not rec.files and rec.stopped_by in LIMIT_STOPS:  # closed by the guard (or budget) with no file: say why
        g = rec.guard or {}
        why = g.get("export_error") or g.get("reason") or "no file"
        res.items.append(Item(role, rank, [w.start, w.end], "incomplete", detail=short(
            f"stopped by {LIMIT_STOPS[rec.stopped_by]} after step {g.get('step', rec.last)}; no trace file: {why}")))
    elif not rec.files and rec.engine is not None:  # a rollout engine's failed or slow flush (engines/)
        res.items.append(Item(role, rank, [w.start, w.end], "incomplete", detail=short(
            f"the engine's traces were not taken ({rec.stopped_by}): {rec.engine.get('error')}")))


def _gaps(w: Window, over: list[WindowRecord]) -> list[tuple[int, int]]:
    """The steps of ``w`` no record covers, as ranges (records sorted by first step)."""
    out, nxt = [], w.start
    for r in over:
        if r.first > nxt:
            out.append((nxt, min(r.first - 1, w.end)))
        nxt = max(nxt, r.last + 1)
    if nxt <= w.end:
        out.append((nxt, w.end))
    return out


def _cut_detail(rec: WindowRecord, w: Window | None, gaps: list[tuple[int, int]]) -> str:
    parts = []
    if w is not None and rec.first > w.start:
        parts.append(f"resumed at step {rec.first}")
    if (by := LIMIT_STOPS.get(rec.stopped_by or "")) is not None:  # the memory guard's or export budget's numbers
        g = rec.guard or {}
        if {"limit", "measured", "limit_value"} <= set(g):  # what the guard records: which limit, measured, limit
            numbers = f"{g['limit']}: measured {g['measured']}, limit {g['limit_value']}"
        else:
            numbers = ", ".join(f"{k} {v}" for k, v in list(g.items())[:6])
        parts.append(f"stopped by {by} after step {rec.last}" + (f" ({short(numbers)})" if numbers else ""))
    elif not rec.complete:
        parts.append(f"cut short by {rec.stopped_by or 'an early stop'} after step {rec.last}")
    text = "; ".join(parts) or f"recorded steps {rec.first}-{rec.last}"
    if gaps:
        return f"{text}: steps {', '.join(f'{a}-{b}' for a, b in gaps)} were not captured"
    return text if w is None else f"{text} (the window's last step)"


def _writers(role: str, rank: int, recs: list[WindowRecord], res: CheckResult) -> None:
    """Two processes writing one (role, rank) at once is a problem; one after the other is a resumed run.

    ``writer_conflict`` says a process found its window's name taken by another writer and kept both files: a
    clash when the two wrote at the same time (or when times are not recorded), a resumed job capturing a window
    again when the other had finished before it began."""
    who = {(r.host, r.pid) for r in recs if r.pid is not None}
    pids = ", ".join(str(p) for _, p in sorted(who, key=lambda x: (str(x[0]), x[1])))
    timed = [r for r in recs if r.pid is not None and r.start_time is not None and r.end_time is not None]
    clash = any(r.writer_conflict and r not in timed for r in recs)
    last_end: dict[tuple[str | None, int | None], float] = {}
    for r in sorted(timed, key=lambda r: r.start_time or 0.0):  # timed: start and end recorded, `or` never applies
        me, start, end_ = (r.host, r.pid), r.start_time or 0.0, r.end_time or 0.0
        if any(k != me and end > start for k, end in last_end.items()):
            clash = True
            break
        last_end[me] = max(last_end.get(me, end_), end_)
    if clash:
        res.problems.append(f"two writers claimed {role} rank {rank} (pids {pids or 'unknown'})")
    elif len(who) > 1:
        again = " (windows captured again are kept in both copies)" if any(r.writer_conflict for r in recs) else ""
        res.notes.append(f"{role} rank {rank}: written by {len(who)} processes one after another (pids {pids}): "
                         f"a resumed run{again}")


def _files(view: RunView, rank_rel: str, rec: WindowRecord, seen: set[str]):
    """(path as the manifest names it, status, detail) for each file of ``rec``."""
    for f in rec.files:
        seen.add(f.path)
        if rec.upload_error is not None or rec.local_path is not None:
            yield f.path, "not_uploaded", (f"upload failed ({short(rec.upload_error or 'no reason recorded')}); the "
                                           f"files stayed on {rec.host or 'an unknown host'} in {rec.local_path}")
            continue
        rel = safe_relpath(f.path, under=rank_rel)
        if rel is None:
            yield f.path, "broken", "names a file outside its rank folder; not read"
            continue
        seen.add(rel)
        status, why = check_file(view, rel, f.bytes)
        yield f.path, status, why


def _check_discrete(view: RunView, role: str, rank: int, lines: list[WindowRecord], expected: list[Window],
                    reached: int, seen: set[str], res: CheckResult) -> None:
    """Discrete mode: every planned step should hold at least one stage window; every stage file listed is checked."""
    by_step: dict[int, list[WindowRecord]] = {}
    for line in lines:
        by_step.setdefault(line.first, []).append(line)
    rank_rel = rank_dir(role, rank)
    steps: list[int] = []
    for w in expected:
        steps += range(w.start, min(w.end, w.start + MAX_WINDOWS - len(steps)) + 1)
        if len(steps) >= MAX_WINDOWS:
            break
    # A step may run without any stage, so the last stage window does not show how far the run got: only a run
    # that was cut short (a stage left by an exception, a signal, stop) is known to have ended there.
    cut = any(line.stopped_by not in (None, "step_end") for line in lines)
    for step in steps:
        if step not in by_step:
            if cut and step > reached:
                res.items.append(Item(role, rank, [step, step], "not_reached",
                                      detail=f"not reached (the run ended at step {reached})"))
            else:
                res.items.append(Item(role, rank, [step, step], "missing",
                                      detail="no stage window for this step (did an annotated stage run in it?)"))
            continue
        for line in by_step.pop(step):
            for f, status, why in _files(view, rank_rel, line, seen):
                if status == "ok" and not line.complete:
                    status, why = "incomplete", f"stage cut short ({line.stopped_by or 'stopped'})"
                res.items.append(Item(role, rank, [step, step], status, f, why or f"stage {line.stage}"))
    for step, rest in sorted(by_step.items()):  # stage windows outside the plan's steps: still checked
        for line in rest:
            for f, status, why in _files(view, rank_rel, line, seen):
                res.items.append(Item(role, rank, [step, step], status, f, why or f"stage {line.stage}"))


def _unlisted(view: RunView, tree, role: str, rank: int, listed: set[str], res: CheckResult) -> None:
    """Files in the rank folder that no manifest line names."""
    rel_dir = rank_dir(role, rank)
    for n in tree.get(rel_dir, ([], []))[1]:
        rel = f"{rel_dir}/{n}"
        if n not in RANK_FILES and not n.startswith(TMP_PREFIX) and rel not in listed:
            res.items.append(Item(role, rank, None, "unlisted", rel, "not in the manifest (another backend or run?)"))


def _check_process_outputs(view: RunView, tree, role: str, backend: str, res: CheckResult, config: Any,
                           world: int) -> None:
    found = process_outputs(view, tree, role, backend)
    if not found:
        res.items.append(Item(role, None, None, "missing",
                              detail=f"no {backend} output: did the wrapped workers end before collection?"))
    res.items += [Item(role, rank_of_process_output(rel), None, status, rel, detail) for rel, status, detail in found]
    why = f"no {backend} output of this rank: did it run under distprof wrap, and end before the check?"
    res.items += [Item(role, r, None, "missing", detail=why) for r in ranks_without_output(found, config, world,
                                                                                             MAX_RANKS)]
