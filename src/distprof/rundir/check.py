"""Is a run directory complete and readable? What is missing or broken?

Expected windows come from the config recorded in run.json and each role's
world size (``{role}/role.json``): every selected rank of every role that
captured must have every window of the plan (for an open-ended schedule, up
to the last step any rank of that role reached). Every listed file must exist
with its recorded size and decode; process-backend outputs must exist, be
finalized (no ``.tmp-`` left) and look like their tool's format.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from ..config import ProfilerConfig
from ..plan import FOREVER, Window
from .layout import MANIFEST, PROCESS_BACKENDS, ROLE_JSON, RUN_JSON, TMP_PREFIX, is_process_output, rank_dir, rank_of_dir
from .manifest import MANIFEST_LIMIT, WindowRecord, read_manifest

__all__ = ["check_run", "CheckResult"]


class _TraceShape(msgspec.Struct):
    traceEvents: list[msgspec.Raw]  # decoded lazily: we only prove the JSON is whole


@dataclass
class Item:
    role: str
    rank: int | None
    steps: list[int] | None
    status: str  # ok | missing | broken | incomplete | unfinished | unlisted
    file: str | None = None
    detail: str = ""


@dataclass
class CheckResult:
    run_dir: str
    roles: list[dict[str, Any]] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be judged (not a problem)

    @property
    def ok(self) -> bool:
        return not self.problems and all(i.status in ("ok", "unlisted") for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "ok": self.ok, "roles": self.roles,
                "items": [asdict(i) for i in self.items], "problems": self.problems, "notes": self.notes}


def check_run(run_dir: str) -> CheckResult:
    root = os.path.abspath(run_dir)
    res = CheckResult(run_dir=root)
    try:
        run = msgspec.json.decode(open(os.path.join(root, RUN_JSON), "rb").read())
        config = ProfilerConfig.from_saved(run["config"])
    except FileNotFoundError:
        res.problems.append(f"{root} is not a distprof run directory: {RUN_JSON} is missing")
        return res
    except Exception as e:
        res.problems.append(f"{RUN_JSON} cannot be read: {type(e).__name__}: {e}")
        return res

    for role in _roles(root):
        _check_role(root, role, config, run, res)
    if not res.roles:
        res.problems.append("no role captured anything (no role directories)")
    for d, dirs, names in os.walk(root):
        for n in names + dirs:
            if n.startswith(TMP_PREFIX):
                rel = os.path.relpath(os.path.join(d, n), root)
                res.items.append(Item(role=rel.split(os.sep)[0], rank=None, steps=None, status="unfinished", file=rel,
                                      detail="a write that never finished (temporary file left behind)"))
    return res


def _roles(root: str) -> list[str]:
    """Role directories: those holding role.json, or a rank directory, at any depth (roles may nest)."""
    roles = []
    for d, dirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        if rel == ".":
            continue
        if ROLE_JSON in names or any(rank_of_dir(x) is not None for x in dirs):
            roles.append(rel.replace(os.sep, "/"))
    return sorted(roles)


def _check_role(root: str, role: str, config: ProfilerConfig, run: dict[str, Any], res: CheckResult) -> None:
    role_dir = os.path.join(root, role)
    info: dict[str, Any] = {}
    try:
        info = msgspec.json.decode(open(os.path.join(role_dir, ROLE_JSON), "rb").read())
    except FileNotFoundError:
        pass
    except Exception as e:
        res.problems.append(f"{role}/{ROLE_JSON} cannot be read: {e}")
    world = int(info.get("world_size") or run.get("world_size") or 1)
    if "config" in info:  # groups may run with their own configs; run.json holds the first writer's
        config = ProfilerConfig.from_saved(info["config"])
    backend = info.get("backend", config.backend)
    res.roles.append({"role": role, "world_size": world, "backend": backend})
    if backend in PROCESS_BACKENDS:
        _check_process_outputs(root, role, backend, res)
        return

    ranks = _expected_ranks(root, role, config, info, world, res)
    manifests = {r: _read_manifest(root, role, r, res) for r in ranks}
    plan = config.plan()
    reached = max((line.last for lines in manifests.values() for line in lines), default=-1)
    expected = _expected_windows(config, plan, reached)
    discrete = config.discrete
    for rank in ranks:
        if discrete:
            _check_discrete(root, role, rank, manifests[rank], expected, res)
            continue
        lines = {tuple(line.steps): line for line in manifests[rank]}
        by_start = {line.first: line for line in manifests[rank]}
        listed = set()
        for w in expected:
            line = lines.get((w.start, w.end)) or by_start.get(w.start)
            if line is None:
                res.items.append(Item(role, rank, [w.start, w.end], "missing", detail="no manifest line for this window"))
                continue
            for f in line.files:
                listed.add(f.path)
                status, detail = _check_file(os.path.join(root, f.path), f.bytes)
                if status == "ok" and not line.complete:
                    status, detail = "incomplete", f"window cut short: recorded steps {line.first}-{line.last}"
                res.items.append(Item(role, rank, [w.start, w.end], status, f.path, detail))
        _check_requested(root, role, rank, manifests[rank], listed, res)
        _unlisted(root, role, rank, listed, res)


def _expected_ranks(root: str, role: str, config: ProfilerConfig, info: dict[str, Any], world: int,
                    res: CheckResult) -> list[int]:
    """The ranks that should have captured: from the rank list, or mesh coordinates and the mesh in role.json.
    Where that cannot be known (per_node: local ranks are not recorded), the ranks that wrote something."""
    if isinstance(config.ranks, dict) and info.get("mesh"):
        from ..mesh import RankMesh, selected_ranks

        m = info["mesh"]
        sel = {k: (v if v == "*" else tuple(v)) for k, v in config.ranks.items()}
        ranks = selected_ranks(sel, RankMesh(tuple(m["names"]), tuple(m["shape"]), tuple(m["ranks"])))
    elif isinstance(config.ranks, dict) or config.per_node is not None:
        on_disk = sorted(r for n in os.listdir(os.path.join(root, role)) if (r := rank_of_dir(n)) is not None)
        res.notes.append(f"{role}: which ranks should capture depends on "
                            f"{'local ranks (per_node)' if config.per_node is not None else 'a mesh not recorded'}; "
                            f"checking the {len(on_disk)} ranks that wrote files")
        return on_disk
    else:
        ranks = list(range(world)) if config.ranks == "all" else list(config.ranks)
    return [r for r in ranks if r < world]


def _check_discrete(root: str, role: str, rank: int, lines: list[WindowRecord], expected: list[Window],
                    res: CheckResult) -> None:
    """Discrete mode: every planned step should hold at least one stage window; every stage file listed is checked."""
    by_step: dict[int, list[WindowRecord]] = {}
    for line in lines:
        by_step.setdefault(line.first, []).append(line)
    listed = set()
    for w in expected:
        for step in range(w.start, w.end + 1):
            if step not in by_step:
                res.items.append(Item(role, rank, [step, step], "missing",
                                      detail="no stage window for this step (did an annotated stage run in it?)"))
                continue
            for line in by_step[step]:
                for f in line.files:
                    listed.add(f.path)
                    status, detail = _check_file(os.path.join(root, f.path), f.bytes)
                    if status == "ok" and not line.complete:
                        status, detail = "incomplete", f"stage cut short ({line.stopped_by or 'stopped'})"
                    res.items.append(Item(role, rank, [step, step], status, f.path,
                                          detail or f"stage {line.stage}"))
    _unlisted(root, role, rank, listed, res)


def _check_requested(root: str, role: str, rank: int, lines: list[WindowRecord], listed: set[str],
                     res: CheckResult) -> None:
    """Windows captured on request (``distprof trigger``): not in the plan, checked like planned ones."""
    for line in lines:
        if line.trigger is None or any(f.path in listed for f in line.files):
            continue
        if not line.files:  # a rank that saw the request too late: not a fault of the run directory
            res.notes.append(f"{role} rank {rank}: skipped requested steps {line.first}-{line.last} "
                             f"(request {line.trigger}, {line.stopped_by})")
        for f in line.files:
            listed.add(f.path)
            status, detail = _check_file(os.path.join(root, f.path), f.bytes)
            if status == "ok" and not line.complete:
                status, detail = "incomplete", f"window cut short: recorded steps {line.first}-{line.last}"
            res.items.append(Item(role, rank, [line.first, line.last], status, f.path,
                                  detail or f"requested (trigger {line.trigger})"))


def _unlisted(root: str, role: str, rank: int, listed: set[str], res: CheckResult) -> None:
    """Files in the rank folder that no manifest line names."""
    rel_dir = rank_dir(role, rank)
    d = os.path.join(root, rel_dir)
    if os.path.isdir(d):
        for n in sorted(os.listdir(d)):
            rel = f"{rel_dir}/{n}"
            if n != MANIFEST and not n.startswith(TMP_PREFIX) and rel not in listed and os.path.isfile(os.path.join(d, n)):
                res.items.append(Item(role, rank, None, "unlisted", rel, "not in the manifest (another backend or run?)"))


def _expected_windows(config: ProfilerConfig, plan, reached: int) -> list[Window]:
    if config.steps is not None:
        return list(plan.windows)
    count = config.window_count()
    horizon = FOREVER - 1 if count is not None else reached
    return plan.windows_until(horizon)[: count if count is not None else None]


def _read_manifest(root: str, role: str, rank: int, res: CheckResult) -> list[WindowRecord]:
    rel = f"{rank_dir(role, rank)}/{MANIFEST}"
    try:
        with open(os.path.join(root, rel), "rb") as f:
            got = read_manifest(f.read(MANIFEST_LIMIT))
    except FileNotFoundError:
        return []
    for problem in got.problems:
        res.items.append(Item(role, rank, None, "broken", rel, f"manifest {problem}"))
    return got.records


def _check_file(path: str, size: int) -> tuple[str, str]:
    if not os.path.exists(path):
        return "missing", "listed in the manifest but not on disk"
    got = os.path.getsize(path)
    if got != size:
        return "broken", f"{got} bytes on disk, manifest says {size}"
    try:
        if path.endswith(".json.gz"):
            with gzip.open(path, "rb") as f:
                msgspec.json.decode(f.read(), type=_TraceShape)
        elif path.endswith(".json"):
            msgspec.json.decode(open(path, "rb").read(), type=_TraceShape)
    except (OSError, EOFError, zlib.error, msgspec.DecodeError, msgspec.ValidationError) as e:
        return "broken", f"does not decode: {e}"
    return "ok", ""


_MAGIC = {".bin": (b"\x04\x22\x4d\x18", b"memray")}  # memray: lz4 frame, or its raw header


def _check_process_outputs(root: str, role: str, backend: str, res: CheckResult) -> None:
    role_dir = os.path.join(root, role)
    outputs = sorted(n for n in os.listdir(role_dir) if is_process_output(n, backend))
    if not outputs:
        res.items.append(Item(role, None, None, "missing", detail=f"no {backend} output: did the wrapped workers end before collection?"))
    for n in outputs:
        path = os.path.join(role_dir, n)
        rel = f"{role}/{n}"
        status, detail = "ok", ""
        if os.path.isdir(path):
            if not os.listdir(path):
                status, detail = "broken", "empty output directory"
        elif os.path.getsize(path) == 0:
            status, detail = "broken", "empty file"
        elif n.endswith(".json"):
            try:
                msgspec.json.decode(open(path, "rb").read())
            except msgspec.DecodeError as e:
                status, detail = "broken", f"does not decode: {e}"
        elif n.endswith(".bin"):
            head = open(path, "rb").read(8)
            if not head.startswith(_MAGIC[".bin"]):
                status, detail = "broken", "not a memray capture"
        res.items.append(Item(role, None, None, status, rel, detail))
