"""On-demand capture requests (``distprof trigger``): their format, where they live, and their acknowledgements.

    {save_path}/.requests/{id}.json                      the request (first writer wins: sent twice, one request)
    {save_path}/.requests/{id}.start                     the agreed first step (first process to accept writes it)
    {save_path}/.requests/{id}.acks/{role~rank}.json     one acknowledgement per (role, rank), replaced as it moves on

The folder is hidden, so the analysis and ``check`` never take it for a role. A request's id is a hash of its
content: the same request sent twice (a retry, two people) is one request.

Acceptance rule (one rule, the same for every process): a process that opted in (``trigger: true``) lists the
folder at most every ``trigger_poll_s`` seconds (monotonic clock). At the first poll that finds a request it is
selected by, it proposes ``start`` = the smallest multiple of ``align`` that is >= its next step + ``lead_steps``,
and writes it to ``{id}.start`` unless another process already did (first writer wins); every process then uses
the start written there, so all selected ranks capture the same global steps. A process whose next step is
already past that start captures nothing and acknowledges ``skipped`` with the step at which it saw the request.
A request may also name ``start_step`` itself (the Ray groups do: the driver knows every worker's step), and
then no claim is needed.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import posixpath
import re
import stat
import threading
import time
import urllib.parse
from typing import Any, Literal

import msgspec

from distprof.rundir.layout import RUN_JSON, is_url, rank_dir
from distprof.rundir.netfs import url_to_fs
from distprof.rundir.safefile import write_bytes

logger = logging.getLogger(__name__)

__all__ = [
    "ACK_STATES",
    "FLAGS",
    "REQUESTS_DIR",
    "TRIGGER_BACKENDS",
    "RequestScanner",
    "RequestStore",
    "TriggerAck",
    "TriggerRequest",
    "aligned_start",
    "make_request",
    "send",
    "status",
    "too_far",
    "trigger",
    "trigger_status",
]

REQUESTS_DIR = ".requests"
FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")  # torch.profiler's options
TRIGGER_BACKENDS = ("torch", "cuda_memory")  # in-process backends: a window can open at any step
ACK_STATES = ("accepted", "captured", "refused", "skipped")
FINAL_STATES = ("captured", "refused", "skipped")
MAX_LEAD = 10_000  # steps; a request waiting longer than this is a typo
MAX_AHEAD = 2 * MAX_LEAD  # steps: the furthest a start may be past the step a process sees it at (lead + align)
_MAX_REQUEST_BYTES = 64 << 10  # a request is a few hundred bytes; the folder is untrusted input
READS_PER_POLL = 64  # request files a poll on the training thread reads at most; the others wait for later polls
READS_PER_SCAN = 1024  # the same on the poll thread (it shares the interpreter lock with training: bounded too)
TAKE_PER_POLL = 8  # new requests a poll answers at most (each answer writes files); the others wait
_ID = re.compile(r"[0-9a-f]{16}")  # what make_request names a request; any other name in the folder is ignored


class TriggerRequest(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One on-demand capture request. Every field but ``id`` and ``created`` makes up the id."""
    steps: int
    """How many consecutive global steps to record."""
    ranks: list[int] | None = None
    """Global ranks that should capture (None: every rank the job's config selects)."""
    roles: list[str] | None = None
    """Roles (names or globs) that should capture (None: every role)."""
    backend: Literal["torch", "cuda_memory"] = "torch"
    flags: list[str] = []
    """torch.profiler options switched on for this window (record_shapes, profile_memory, ...)."""
    lead_steps: int = 5
    """The start is at least this many steps after the step at which the first process sees the request."""
    align: int = 10
    """The start is a multiple of this, so processes a few steps apart still agree."""
    start_step: int | None = None
    """An absolute first step (the Ray groups set it); None: agreed by the first process to accept."""
    tag: str = ""
    """Anything: a request with another tag is another request (to capture the same thing again)."""
    id: str = ""
    created: float = 0.0


class TriggerAck(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One (role, rank)'s answer to a request; ``state`` moves accepted -> captured, or is refused / skipped."""
    id: str
    role: str
    rank: int
    state: Literal["accepted", "captured", "refused", "skipped"]
    detail: str = ""
    steps: list[int] | None = None
    """First and last global step agreed (accepted) or recorded (captured)."""
    seen_step: int | None = None
    """The step this process was about to run when it saw the request."""
    file: str | None = None
    time: float = 0.0
    host: str | None = None
    pid: int | None = None


def _content(req: TriggerRequest) -> bytes:
    fields = msgspec.structs.asdict(req)
    fields.pop("id"), fields.pop("created")
    return msgspec.json.encode(dict(sorted(fields.items())))


def make_request(steps: Any, ranks: Any = None, roles: Any = None, backend: str = "torch", flags: Any = None,
                 lead_steps: int = 5, align: int = 10, start_step: int | None = None, tag: str = "",
                 max_steps: int | None = None) -> TriggerRequest:
    """A validated request with its id. ValueError names the argument, the value and the fix."""
    _check_counts(steps, lead_steps, align, start_step, max_steps)
    ranks, roles = _selection(ranks, roles)
    flags = _backend_flags(backend, flags)
    if not isinstance(tag, str) or len(tag) > 200 or not tag.isprintable():
        raise ValueError(f"trigger tag={tag!r} must be printable text of at most 200 characters")
    req = TriggerRequest(steps=steps, ranks=ranks, roles=roles, backend=_backend(backend), flags=flags,
                         lead_steps=lead_steps, align=align, start_step=start_step, tag=tag)
    rid = hashlib.sha256(_content(req)).hexdigest()[:16]
    req = msgspec.structs.replace(req, id=rid, created=time.time())
    size = len(msgspec.json.encode(req))
    if size > _MAX_REQUEST_BYTES:  # a job reads no more than this: it would take the request for a corrupt file
        raise ValueError(f"trigger request is {size} bytes, over the {_MAX_REQUEST_BYTES} a job reads "
                         f"({len(ranks or [])} ranks, {len(roles or [])} roles); give fewer ranks or roles, "
                         "or globs such as rollout*")
    return req


def _check_counts(steps: Any, lead_steps: Any, align: Any, start_step: Any, max_steps: int | None) -> None:
    def whole(name: str, v: Any, lo: int, hi: int, fix: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"trigger {name}={v!r} is out of range; {fix}")
        return v

    cap = max_steps if max_steps is not None else 10_000
    whole("steps", steps, 1, cap, f"give a number of steps from 1 to {cap}"
          + (" (the job's trigger_max_steps)" if max_steps is not None else ""))
    whole("lead_steps", lead_steps, 0, MAX_LEAD, f"give 0..{MAX_LEAD} steps")
    whole("align", align, 1, MAX_LEAD, f"give 1..{MAX_LEAD} (1: no alignment)")
    if start_step is not None:
        whole("start_step", start_step, 0, 2**62, "give a global step number >= 0, or leave it out")


def _selection(ranks: Any, roles: Any) -> tuple[Any, Any]:
    """The request's ranks (a sorted list) and roles (names or globs), checked."""
    # Kept here: config.model is pydantic; `distprof trigger --status` and distprof.trigger_status() import this
    # module and never make a request, so they stay free of it.
    from distprof.config.model import _parse_steps

    if ranks is not None:
        try:
            ranks = _parse_steps(ranks)
        except ValueError:
            raise ValueError(f"trigger ranks={ranks!r} is not a list of ranks; "
                             "give global ranks such as 0,3-5") from None
    if roles is not None:
        roles = [r for r in (roles.split(",") if isinstance(roles, str) else roles) if str(r).strip()]
        if not roles or not all(isinstance(r, str) and r.isprintable() and len(r) <= 200 for r in roles):
            raise ValueError(f"trigger roles={roles!r} must be role names or globs such as actor,rollout*")
    return ranks, roles


def _backend(backend: str) -> Literal["torch", "cuda_memory"]:
    """``backend``, checked by :func:`_backend_flags`, as the request's field type."""
    return "cuda_memory" if backend == "cuda_memory" else "torch"


def _backend_flags(backend: str, flags: Any) -> list[str]:
    """The request's torch.profiler flags (sorted, unique), checked with its backend."""
    if backend not in TRIGGER_BACKENDS:
        raise ValueError(f"trigger backend={backend!r} is not supported; choose one of {', '.join(TRIGGER_BACKENDS)}")
    flags = sorted(set(flags.split(",") if isinstance(flags, str) else (flags or [])) - {""})
    bad = [f for f in flags if f not in FLAGS]
    if bad:
        raise ValueError(f"trigger flags {bad} are not torch.profiler options; choose from {', '.join(FLAGS)}")
    if flags and backend != "torch":
        raise ValueError(f"trigger flags {flags} apply to backend torch only, not {backend!r}; drop them")
    return flags


def _ignoring(problems: list[str] | None, path: str, why: Any) -> None:
    """Say why ``path`` is ignored: logged now, or added to ``problems`` (a poll says them in one warning)."""
    if problems is None:
        logger.warning("distprof: ignoring %s: %s", path, why)
    else:
        problems.append(f"{path}: {why}")


def _read_regular(path: str, problems: list[str] | None = None) -> bytes | None:
    """At most _MAX_REQUEST_BYTES of ``path`` if it is a regular file, not a link (None otherwise, logged): a FIFO
    there would block a training step or `--status` forever, a link could point anywhere, a folder raises."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        _ignoring(problems, path, e.strerror or e)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            _ignoring(problems, path, "not a regular file")
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(_MAX_REQUEST_BYTES)
    finally:
        os.close(fd)


def _failed(what: str, e: OSError) -> OSError:
    """A storage error as one line naming what failed, where, and why (the CLI prints it and exits 2)."""
    why = e.strerror or str(e) or type(e).__name__
    return OSError(f"{what}: {why}" + (f" ({e.filename})" if e.filename and str(e.filename) not in what else ""))


def aligned_start(step: int, lead_steps: int, align: int) -> int:
    """The smallest multiple of ``align`` that is >= ``step + lead_steps``."""
    return -(-(step + lead_steps) // align) * align


def too_far(start: int, step: int) -> str | None:
    """Why a process at ``step`` refuses a request starting at ``start`` (its ``start_step``, or the agreed start
    someone wrote in ``{id}.start``): more than MAX_AHEAD steps ahead is a typo or a forgery, and accepting it
    would keep the process busy (every later request refused as pending) for the rest of the job."""
    if start - step <= MAX_AHEAD:
        return None
    return (f"its start step {start} is more than {MAX_AHEAD} steps after step {step}, where this process saw it; "
            "send a start_step closer to the job's current step (or none: the processes agree on one)")


def _ack_name(role: str, rank: int) -> str:
    # Roles nest ("actor/micro_step"); the acks folder is flat, so the rank folder's name is quoted whole.
    return urllib.parse.quote(rank_dir(role, rank), safe="") + ".json"


class RequestStore:
    """The requests folder of one save_path, local (or ``file://``) or an fsspec URL. Touches nothing until asked."""

    def __init__(self, save_path: str):
        self.save_path = save_path
        self.remote = is_url(save_path)
        root = save_path[len("file://"):] if save_path.startswith("file://") else save_path
        self.root = root if self.remote else os.path.abspath(os.path.expanduser(root))
        self._fs = None

    @property
    def fs(self):
        if self._fs is None:
            self._fs, self.root = url_to_fs(self.save_path)  # bounded waits (netfs.py)
        return self._fs

    def _path(self, *parts: str) -> str:
        join = posixpath.join if self.remote else os.path.join
        return join(self.root, REQUESTS_DIR, *parts)

    # ---- small I/O primitives: one place for local vs fsspec ------------------------------------------------
    def _read(self, path: str, problems: list[str] | None = None) -> bytes | None:
        try:
            if self.remote:
                return self.fs.cat_file(path, start=0, end=_MAX_REQUEST_BYTES)
            return _read_regular(path, problems)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def folder_problem(self) -> str | None:
        """Why the requests folder cannot hold requests (a file or a link in its place); None when it can."""
        if self.remote:
            return None
        path = self._path()
        if os.path.islink(path):
            return f"{path} is a symbolic link; distprof neither reads nor writes through it: remove it"
        if os.path.lexists(path) and not os.path.isdir(path):
            return f"{path} is not a folder; no job can read requests there: remove it"
        return None

    def _list(self, path: str) -> list[str]:
        """Entry names in ``path`` ([] when it does not exist)."""
        try:
            if self.remote:
                return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False))
            if os.path.islink(path):  # the folder is untrusted: never list (or read) through a link out of it
                logger.warning("distprof: ignoring %s: it is a symbolic link", path)
                return []
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _replace(self, path: str, data: bytes) -> None:
        """Write ``path`` whole, replacing it atomically (a reader sees the old or the new content)."""
        if self.remote:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, data)
            return
        # The requests folder is untrusted: an exclusive temporary, no link followed on the way (safefile).
        write_bytes(self.root, os.path.relpath(path, self.root), data)

    def _create(self, path: str, data: bytes) -> bool:
        """Write ``path`` unless it exists (first writer wins); True if we wrote it."""
        if self.remote:
            # Object stores offer no exclusive create through fsspec: two processes that see a request within
            # the same round trip may both write a start, and the later object wins. They proposed the same
            # start unless their steps straddle an ``align`` boundary; a process whose start differs from the
            # one others read is then visible in `distprof trigger --status` (its acknowledged steps differ).
            if self.fs.exists(path):
                return False
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, data)
            return True
        return write_bytes(self.root, os.path.relpath(path, self.root), data, exclusive=True)

    # ---- the run directory ---------------------------------------------------------------------------------
    def _run_json(self) -> bytes | None:
        path = posixpath.join(self.root, RUN_JSON) if self.remote else os.path.join(self.root, RUN_JSON)
        try:
            return self._read(path)
        except OSError as e:  # the store answered with an error (an S3 500, a permission): not "no run.json"
            raise _failed(f"cannot read {path}", e) from None

    def is_run_dir(self) -> bool:
        """True when run.json is there; OSError naming it when the store cannot say."""
        return self._run_json() is not None

    def run_config(self) -> dict[str, Any] | None:
        """The config recorded in run.json (None when it is missing or malformed; OSError when unreadable)."""
        data = self._run_json()
        try:
            cfg = msgspec.json.decode(data or b"").get("config")
        except (msgspec.DecodeError, AttributeError):
            return None
        return cfg if isinstance(cfg, dict) else None

    # ---- requests ------------------------------------------------------------------------------------------
    def put(self, req: TriggerRequest) -> bool:
        """Store ``req``; False when the same request is already there (nothing changes)."""
        return self._create(self._path(f"{req.id}.json"), msgspec.json.encode(req))

    def ids(self) -> list[str]:
        return [n[:-5] for n in self._list(self._path()) if n.endswith(".json") and _ID.fullmatch(n[:-5])]

    def get(self, rid: str, problems: list[str] | None = None) -> TriggerRequest | None:
        """The request ``rid``; None when missing or malformed (logged, or added to ``problems``: the folder is
        untrusted input)."""
        if not _ID.fullmatch(rid):
            return None
        data = self._read(self._path(f"{rid}.json"), problems)
        if data is None:
            return None
        try:
            req = msgspec.json.decode(data, type=TriggerRequest)
            if req.id != rid:
                raise ValueError(f"it names itself {req.id!r}")
            # Re-validated as a sender would: a hand-written file cannot ask for what the API refuses.
            make_request(req.steps, req.ranks, req.roles, req.backend, req.flags, req.lead_steps, req.align,
                         req.start_step, req.tag)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            _ignoring(problems, self._path(f"{rid}.json"), f"not a trigger request: {e}")
            return None
        return req

    def claim_start(self, rid: str, proposed: int) -> int:
        """The agreed first step of request ``rid``: ``proposed`` if we are first, else the one written before."""
        path = self._path(f"{rid}.start")
        self._create(path, msgspec.json.encode({"start": proposed}))
        try:
            got = msgspec.json.decode(self._read(path) or b"{}").get("start")
        except (msgspec.DecodeError, AttributeError):
            got = None
        if isinstance(got, bool) or not isinstance(got, int) or got < 0:
            logger.warning("distprof: %s is malformed; using start step %d", path, proposed)
            return proposed
        return got

    def agreed_start(self, rid: str) -> int | None:
        try:
            got = msgspec.json.decode(self._read(self._path(f"{rid}.start")) or b"{}").get("start")
        except (msgspec.DecodeError, AttributeError):
            return None
        return got if isinstance(got, int) and not isinstance(got, bool) else None

    # ---- acknowledgements ----------------------------------------------------------------------------------
    def ack(self, ack: TriggerAck) -> None:
        self._replace(self._path(f"{ack.id}.acks", _ack_name(ack.role, ack.rank)), msgspec.json.encode(ack))

    def my_ack(self, rid: str, role: str, rank: int) -> TriggerAck | None:
        data = self._read(self._path(f"{rid}.acks", _ack_name(role, rank)))
        try:
            return msgspec.json.decode(data, type=TriggerAck) if data else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def acks(self, rid: str) -> list[TriggerAck]:
        out = []
        folder = self._path(f"{rid}.acks")
        for n in self._list(folder):
            if not n.endswith(".json") or n.startswith("."):
                continue
            data = self._read(self._path(f"{rid}.acks", n))
            try:
                out.append(msgspec.json.decode(data or b"", type=TriggerAck))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                logger.warning("distprof: ignoring malformed acknowledgement %s/%s: %s", folder, n, e)
        return sorted(out, key=lambda a: (a.role, a.rank))


class RequestScanner:
    """The requests a process has not looked at yet, found without stalling its training thread.

    The folder is untrusted input: anyone who can write it can fill it with junk (50,000 files). ``scan`` lists
    it and reads each new request file once, at most ``limit`` per scan (the others wait for the next), and says
    what it ignored in one warning per scan, however many files that is. The profiler scans from its poll
    thread (``trigger_poll_s`` > 0: READS_PER_SCAN), so a step never reads the folder; on the training thread
    (the first poll at start(), and every step with ``trigger_poll_s: 0``) READS_PER_POLL. ``take`` hands the
    valid requests found to the training thread, a few per poll, where they are answered.
    """

    def __init__(self, store: RequestStore, who: str):
        self.store, self.who = store, who
        self._examined: set[str] = set()  # ids read (valid or not): never read again
        self._found: collections.deque[TriggerRequest] = collections.deque()
        self._scanning = threading.Lock()  # one scan at a time; ``take`` never waits for it (deque ops are atomic)
        self._unchanged: tuple[int, int] | None = None  # the folder's (inode, mtime) at the last listing, if trusted
        self._listed = 0.0  # time.monotonic() of the last listing
        self._unread: list[str] = []  # ids that listing found and no scan has read yet

    def _same_folder(self) -> bool:
        """True when the local folder is as it was at the last listing: then a scan reads on from what that
        listing found, and a poll costs one stat, not a listing (50,000 names). The folder's mtime changes with
        every file added; it is trusted when over 2 s older than the listing (a file added in the same clock
        tick leaves it alone), and for 60 s (a shared filesystem's clock may differ from ours)."""
        if self.store.remote or self._unchanged is None or time.monotonic() - self._listed > 60:
            return False
        try:
            st = os.stat(self.store._path())
        except OSError:
            return False
        return (st.st_ino, st.st_mtime_ns) == self._unchanged

    def scan(self, limit: int) -> None:
        """Read at most ``limit`` new request files; none if a scan is running (it never waits for one)."""
        if not self._scanning.acquire(blocking=False):
            return
        try:
            self._scan(limit)
        finally:
            self._scanning.release()

    def _scan(self, limit: int) -> None:
        if not self._same_folder():
            self._unchanged, self._listed = None, time.monotonic()
            try:
                st = None if self.store.remote else os.stat(self.store._path())
                ids = self.store.ids()
            except FileNotFoundError:
                return
            except Exception as e:  # storage trouble (a network blip on a URL): try again at the next poll
                logger.warning("distprof: %s could not list capture requests in %s: %s: %s", self.who,
                               self.store._path(), type(e).__name__, e)
                return
            self._unread = [rid for rid in ids if rid not in self._examined]
            if st is not None and time.time() - st.st_mtime > 2:
                self._unchanged = (st.st_ino, st.st_mtime_ns)
        batch, self._unread = self._unread[:limit], self._unread[limit:]
        problems: list[str] = []
        for rid in batch:
            try:
                req = self.store.get(rid, problems)
            except Exception as e:  # storage trouble: read it again at a later scan
                problems.append(f"{self.store._path(rid + '.json')}: {type(e).__name__}: {e}")
                self._unread.append(rid)
                continue
            self._examined.add(rid)
            if req is not None:
                self._found.append(req)
        if problems:
            logger.warning("distprof: %s ignored %d file(s) in %s that are not trigger requests (first: %s)%s",
                           self.who, len(problems), self.store._path(), problems[0],
                           f"; {len(self._unread)} to read at the next polls" if self._unread else "")

    def take(self, n: int = TAKE_PER_POLL) -> list[TriggerRequest]:
        """Up to ``n`` of the requests found, oldest first; the others stay for the next poll."""
        out: list[TriggerRequest] = []
        while len(out) < n and self._found:
            out.append(self._found.popleft())  # only this thread pops: the deque is not empty here
        return out


def send(run_dir: str, require_run: bool = True, **fields: Any) -> tuple[TriggerRequest, bool]:
    """Validate and store a request under ``run_dir``; (request, True if new). ValueError when refused."""
    store = RequestStore(run_dir)
    cfg = store.run_config() if require_run else None
    if require_run and cfg is None:
        raise ValueError(f"{run_dir} is not a distprof run directory ({RUN_JSON} is missing or unreadable): "
                         "give the save_path of a running job that set trigger: true")
    max_steps = None
    if cfg is not None:
        if not cfg.get("trigger"):
            logger.warning("distprof: the config in %s/%s does not set trigger: true; only processes that opted in "
                           "(trigger: true or DISTPROF_TRIGGER=1) will answer", run_dir, RUN_JSON)
        m = cfg.get("trigger_max_steps")
        max_steps = m if isinstance(m, int) and not isinstance(m, bool) and m > 0 else None
    req = make_request(max_steps=max_steps, **fields)
    problem = store.folder_problem()
    if problem:
        raise ValueError(problem)
    try:
        existing = store.get(req.id)
        if existing is not None:
            return existing, False
        return req, store.put(req)
    except OSError as e:
        raise _failed(f"cannot write trigger request {req.id} in {store._path()}", e) from None


def status(run_dir: str, rid: str | None = None, require_run: bool = False) -> dict[str, Any]:
    """Every request (or request ``rid``) with its agreed start and each (role, rank)'s acknowledgement.
    ValueError when ``require_run`` and ``run_dir`` has no run.json, or the requests folder is not a folder;
    OSError naming the path when the store cannot be read."""
    store = RequestStore(run_dir)
    if require_run and not store.is_run_dir():
        raise ValueError(f"{run_dir} is not a distprof run directory ({RUN_JSON} is missing)")
    problem = store.folder_problem()
    if problem:
        raise ValueError(problem)
    try:
        return _status(store, run_dir, rid)
    except OSError as e:
        raise _failed(f"cannot read the trigger requests in {store._path()}", e) from None


def _status(store: RequestStore, run_dir: str, rid: str | None) -> dict[str, Any]:
    ids = [rid] if rid is not None else store.ids()
    out = []
    problems: list[str] = []  # files that are not requests: said once, not once per file
    for i in ids:
        req = store.get(i, problems)
        if req is None:
            if rid is not None:
                raise ValueError(f"no trigger request {rid!r} in {run_dir}; `distprof trigger {run_dir} --status` "
                                 "lists the ids")
            continue
        acks = store.acks(i)
        start = req.start_step if req.start_step is not None else store.agreed_start(i)
        out.append({"id": i, "request": msgspec.to_builtins(req), "start_step": start,
                    "acks": [msgspec.to_builtins(a) for a in acks],
                    "done": bool(acks) and all(a.state in FINAL_STATES for a in acks)})
    if problems:
        logger.warning("distprof: ignored %d file(s) in %s that are not trigger requests (first: %s)",
                       len(problems), store._path(), problems[0])
    out.sort(key=lambda r: r["request"].get("created", 0.0))
    return {"run_dir": run_dir, "requests": out}


def trigger(run_dir: str, steps: int, ranks: Any = None, roles: Any = None, backend: str = "torch", flags: Any = None,
            lead_steps: int = 5, align: int = 10, start_step: int | None = None, tag: str = "") -> str:
    """Ask every process of a running job that opted in (``trigger: true``) to capture ``steps`` global steps.

    ``run_dir``: the job's save_path (local, ``file://`` or an fsspec URL); ``ranks`` / ``roles`` narrow the
    processes (within those the job's config selects); ``flags``: torch.profiler options for this window.
    Returns the request's id (the same request sent twice is stored once). Watch it with
    :func:`trigger_status`. ValueError when refused (not a run directory, over ``trigger_max_steps``, ...).
    """
    req, new = send(run_dir, steps=steps, ranks=ranks, roles=roles, backend=backend, flags=flags,
                    lead_steps=lead_steps, align=align, start_step=start_step, tag=tag)
    logger.info("distprof: %s trigger request %s in %s", "sent" if new else "already sent:", req.id, run_dir)
    return req.id


def trigger_status(run_dir: str, id: str | None = None) -> dict[str, Any]:
    """``{"run_dir", "requests": [{"id", "request", "start_step", "acks": [...], "done"}]}``; see :func:`status`."""
    return status(run_dir, id)
