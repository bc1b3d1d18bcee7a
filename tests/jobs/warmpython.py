"""``python SCRIPT ARGS`` and ``python -c CODE ARGS`` for tests, without a torch import apiece.

A test that starts a job script (tests/jobs/crash_job.py, chaos_job.py, ...) to see how distprof behaves when that
process ends (an uncaught exception, ``sys.exit``, a signal in the middle of an export, ``atexit``) pays about
3 s of CPU for the job's ``import torch`` alone; the suite starts dozens. :func:`run` and :func:`Popen` take the
arguments ``subprocess`` takes and start the job as a child of one server process per test process (this file run
as a script, started on first use) that imported torch once and then forks on request.

What the job sees is what ``python SCRIPT`` gives it, except that torch is already imported:
- a process of its own (its own pid, signals sent to that pid, its exit status: ``returncode`` is negative for a
  signal, as in ``subprocess``), with the stdin, stdout and stderr the caller gave (pipes, files, DEVNULL), its
  environment, working directory and ``sys.argv``; ``sys.path`` as ``python`` builds it from that environment's
  ``PYTHONPATH`` and the script's folder;
- the script runs as ``__main__`` (``sys.modules["__main__"]`` is its module until the process ends) in the
  server's main thread, with Python's own signal dispositions, and then the interpreter ends as ``python`` does:
  non-daemon threads joined, ``atexit`` handlers, stdio flushed; an uncaught exception prints its traceback and
  exits 1, ``sys.exit(n)`` exits n.
What it does not give, so the tests about these still start a real ``python``: interpreter options (``-O``,
``-X``), a process in which torch was never imported (the tests of what importing distprof or opening a window
imports), environment variables torch reads while it is imported, and a fresh interpreter's random seeds
(``random`` reseeds itself in every fork; torch's generator does not).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading

SERVER = os.path.abspath(__file__)
PRELOAD = ("torch",)
_HEADER = 1 << 20  # the largest request (argv and environment), bytes

_lock = threading.Lock()
_server: dict[int, tuple[subprocess.Popen, str]] = {}


# ---- the client ------------------------------------------------------------------------------------------------
def _address() -> str:
    """The server's socket, started for this process if it is not running yet."""
    with _lock:
        got = _server.get(os.getpid())
        if got is not None and got[0].poll() is None:
            return got[1]
        folder = tempfile.mkdtemp(prefix="warmpython-")
        path = os.path.join(folder, "s")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DISTPROF_")}
        # stdin is the server's lifeline: it ends when this process does (and closes its end).
        proc = subprocess.Popen([sys.executable, SERVER, path, *PRELOAD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=folder)
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"warmpython server did not start (exit status {proc.wait()})")
        _server[os.getpid()] = (proc, path)
        return path


def _fd(spec, default, mode, pipes):
    """The file descriptor the child gets for one stream, and the caller's end of a pipe (or None)."""
    if spec is None:
        return default, None
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        pipes.append(fd)
        return fd, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        child, mine = (r, w) if mode == "w" else (w, r)
        pipes.append(child)
        return child, mine
    if spec == subprocess.STDOUT:
        return -1, None
    return (spec if isinstance(spec, int) else spec.fileno()), None


class Popen:
    """A job started by the server: the parts of ``subprocess.Popen`` the tests use."""

    def __init__(self, args, stdin=None, stdout=None, stderr=None, text=False, env=None, cwd=None,
                 start_new_session=False):
        args = [os.fspath(a) for a in args]
        if args[0] != sys.executable or len(args) < 2 or args[1].startswith("-") and args[1] != "-c":
            raise ValueError(f"warmpython runs `python SCRIPT ...` or `python -c CODE ...`, not {args[:3]}")
        mine: list[int] = []  # this side's copies of the child's ends, closed once sent
        fds = []
        ends = []
        for spec, default, mode in ((stdin, 0, "w"), (stdout, 1, "r"), (stderr, 2, "r")):
            fd, end = _fd(spec, default, mode, mine)
            fds.append(fd)
            ends.append(end)
        if fds[2] == -1:
            fds[2] = fds[1]
        request = {"argv": args[1:], "env": dict(os.environ if env is None else env),
                   "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(), "setsid": bool(start_new_session)}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(_address())
            body = json.dumps(request).encode()
            socket.send_fds(self._sock, [len(body).to_bytes(8, "big") + body], fds)
            self._buf = b""
            self.pid = self._line(None)["pid"]
        finally:
            for fd in mine:
                os.close(fd)
        self.args = args
        self.returncode = None
        wrap = (lambda fd, m: open(fd, m, encoding="utf-8", errors="strict")) if text else \
            (lambda fd, m: open(fd, m + "b"))
        self.stdin = wrap(ends[0], "w") if ends[0] is not None else None
        self.stdout = wrap(ends[1], "r") if ends[1] is not None else None
        self.stderr = wrap(ends[2], "r") if ends[2] is not None else None

    def _line(self, timeout):
        """The server's next line about this job: its pid, then its exit status (``socket.timeout`` if none comes
        within ``timeout`` seconds; a socket that timed out can be read again)."""
        self._sock.settimeout(timeout)
        while b"\n" not in self._buf:
            more = self._sock.recv(4096)
            if not more:
                raise RuntimeError("warmpython server went away")
            self._buf += more
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def poll(self):
        if self.returncode is None:
            try:
                self.returncode = self._line(0.0)["returncode"]
            except (TimeoutError, socket.timeout, BlockingIOError):
                pass
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            try:
                self.returncode = self._line(timeout)["returncode"]
            except (TimeoutError, socket.timeout, BlockingIOError):
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._sock.close()
        return self.returncode

    def communicate(self, input=None, timeout=None):
        """As ``subprocess.Popen.communicate``: write ``input``, read stdout and stderr to their ends, wait."""
        got = {}

        def drain(name, f):
            got[name] = f.read()

        readers = [threading.Thread(target=drain, args=(n, f), daemon=True)
                   for n, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
        for t in readers:
            t.start()
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        for t in readers:
            t.join(timeout)
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(timeout)
        return got.get("out"), got.get("err")

    def send_signal(self, sig):
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(15)

    def kill(self):
        try:
            self.send_signal(9)
        except ProcessLookupError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()


def run(args, input=None, capture_output=False, timeout=None, check=False, stdin=None, stdout=None, stderr=None,
        **kwargs):
    """As ``subprocess.run``."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    if input is not None:
        stdin = subprocess.PIPE
    proc = Popen(args, stdin=stdin, stdout=stdout, stderr=stderr, **kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# ---- the server ------------------------------------------------------------------------------------------------
def _serve(path: str) -> dict | None:
    """Accept requests until stdin closes; in a forked child, return its request (the child becomes the job)."""
    import selectors

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    jobs: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the client's connection)
    while True:
        for key, _ in sel.select():
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    return None
            elif key.data == "accept":
                conn, _ = listener.accept()
                request = _receive(conn)
                if request is None:
                    conn.close()
                    continue
                request["_keep"] = [listener, conn, sel, *[c for _, c in jobs.values()], *jobs]
                pid = os.fork()
                if pid == 0:
                    return request
                for fd in request["fds"]:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                pidfd = os.pidfd_open(pid)
                jobs[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ, "exit")
            else:
                pid, conn = jobs.pop(key.fd)
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:  # the test that asked is gone
                    pass
                conn.close()


def _receive(conn: socket.socket) -> dict | None:
    msg, fds, _, _ = socket.recv_fds(conn, _HEADER + 8, 3)
    size = int.from_bytes(msg[:8], "big")
    body = msg[8:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            return None
        body += more
    request = json.loads(body)
    request["fds"] = fds
    return request


def _become(request: dict) -> None:
    """In the forked child: take the job's streams, environment, folder and arguments, and run it as __main__."""
    import types

    for thing in request.pop("_keep"):
        if isinstance(thing, int):
            os.close(thing)
        else:
            thing.close()
    if request["setsid"]:
        os.setsid()
    fds = request["fds"]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    if argv[0] == "-c":
        code, name, first = argv[1], "<string>", ""
        sys.argv = ["-c", *argv[2:]]
    else:
        name = os.path.abspath(argv[0])
        with open(name, "rb") as f:
            code = f.read()
        first = os.path.dirname(name)
        sys.argv = list(argv)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *_BASE_PATH]
    sys.path_importer_cache.clear()
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=__builtins__, __file__=name if first else None)
    if not first:
        del main.__file__
    sys.modules["__main__"] = main
    exec(compile(code, name, "exec"), main.__dict__)


if __name__ == "__main__":
    _BASE_PATH = list(sys.path[1:])  # the server's own folder is not the job's; no PYTHONPATH was given to it
    for module in sys.argv[2:]:
        __import__(module)
    job = _serve(sys.argv[1])
    if job is not None:
        _become(job)
