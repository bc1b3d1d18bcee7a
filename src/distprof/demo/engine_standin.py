"""A STAND-IN for a vLLM or SGLang server, for distprof's tests and ``distprof demo`` only.

vLLM and SGLang need CUDA, so they cannot run where distprof is tested. This stand-in speaks their documented
profiling API, taken from :mod:`distprof.capture.engines.contract` (routes, request bodies, replies and status codes,
trace file names, one trace per rank), over HTTP on 127.0.0.1 (:class:`StandinServer`) or in process
(:class:`StandinLLM`, like ``vllm.LLM``). It runs a tiny torch model in ``ranks`` worker processes of its own
(its "TP ranks"), each recording a real torch.profiler trace (CPU) while profiling is on, and ``/generate``
does real work in them. A slow flush (``flush_gate``, ``flush_delay_s``), an engine that dies (:meth:`kill`) and
hostile replies (``hostile``) can be asked for. It is not a model of either engine's performance.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from distprof.capture.engines.contract import CONTRACTS, sglang_file_name, vllm_file_name

__all__ = ["StandinEngine", "StandinLLM", "StandinServer"]


def _worker(rank: int, conn: Any, parent: int) -> None:
    """One "TP rank": a tiny model; records a torch.profiler trace between start and stop. Leaves with its parent."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    # torch.profiler's first start in a process initialises Kineto (1.8 s here); a served engine has long paid
    # it when a job profiles it, so the stand-in pays it at boot, not inside the job's first window.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass
    prof, path, left = None, None, None

    def finish() -> None:
        nonlocal prof, left
        if prof is not None:
            prof.stop()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            prof.export_chrome_trace(path)  # gzipped: the name ends in .gz
            prof, left = None, None

    while True:
        if not conn.poll(0.5):
            if os.getppid() != parent:
                return
            continue
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError):
            return
        if cmd == "start":
            path, left = arg["path"], arg.get("num_steps")
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.start()
            conn.send(True)
        elif cmd == "stop":
            was = prof is not None
            finish()
            conn.send(was)
        elif cmd == "generate":
            x = torch.randn(8, 64)
            with torch.no_grad():
                for i in range(arg):
                    # One engine iteration (vLLM's worker names it execute_model), its first a prefill.
                    with torch.profiler.record_function("execute_model"), \
                            torch.profiler.record_function("prefill" if i == 0 else "decode"):
                        x = torch.tanh(model(x))
                    if left is not None:
                        left -= 1
                        if left <= 0:
                            finish()  # the engine's own iteration limit (SGLang num_steps, vLLM max_iterations)
            conn.send(float(x.sum()))
        elif cmd == "exit":
            finish()
            return


class StandinEngine:
    """The engine: ``ranks`` worker processes and the profiling state of one engine kind."""

    def __init__(self, kind: str = "sglang", ranks: int = 2, trace_dir: str | None = None,
                 flush_delay_s: float = 0.0, flush_gate: threading.Event | None = None, version: str | None = None,
                 start_gate: threading.Event | None = None):
        self.contract = CONTRACTS[kind]
        self.start_gate = start_gate  # a slow start: start_profile waits for it (an engine's profiler takes seconds)
        self.kind, self.trace_dir, self.flush_delay_s, self.flush_gate = kind, trace_dir, flush_delay_s, flush_gate
        self.version = version or f"{self.contract.version}.0-standin"
        self.instance_id = uuid.uuid4().hex[:8]
        self.profiling = False
        self.last_out: str | None = None
        self.iterations = 0  # generation iterations run (per rank)
        self._lock = threading.Lock()
        ctx = mp.get_context("fork")
        self._conns, self._procs = [], []
        for r in range(ranks):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, b, os.getpid()), daemon=True, name=f"standin-{kind}-tp{r}")
            p.start()
            self._conns.append(a)
            self._procs.append(p)

    def _all(self, cmd: str, args: list[Any]) -> list[Any]:
        with self._lock:
            for c, a in zip(self._conns, args, strict=False):
                c.send((cmd, a))
            return [c.recv() for c in self._conns]

    def start_profile(self, output_dir: str | None = None, num_steps: int | None = None, **_: Any) -> None:
        if self.start_gate is not None:
            self.start_gate.wait()
        out = output_dir or self.trace_dir or os.environ.get(self.contract.dir_env) or "/tmp"
        pid = str(time.time())
        names = [vllm_file_name(self.instance_id, r, time.time_ns()) if self.kind == "vllm"
                 else sglang_file_name(pid, tp=r) for r in range(len(self._conns))]
        self.last_out = out
        self._all("start", [{"path": os.path.join(out, n), "num_steps": num_steps} for n in names])
        self.profiling = True

    def stop_profile(self) -> bool:
        """Stop and write every rank's trace; False when no rank was profiling (stopped by its iteration limit)."""
        if self.flush_gate is not None:
            self.flush_gate.wait()
        if self.flush_delay_s:
            time.sleep(self.flush_delay_s)  # a slow flush, as the real engines' exports of big traces
        was = any(self._all("stop", [None] * len(self._conns)))
        self.profiling = False
        return was

    def generate(self, iterations: int = 4) -> float:
        out = self._all("generate", [iterations] * len(self._conns))
        self.iterations += iterations
        return sum(out)

    def kill(self) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.join(5)

    def close(self) -> None:
        try:
            self._all("exit", [None] * len(self._conns))
        except (OSError, EOFError):
            pass
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.kill()


class StandinLLM(StandinEngine):
    """In process, like ``vllm.LLM``: ``start_profile()`` / ``stop_profile()`` / ``generate()``."""

    def __init__(self, kind: str = "vllm", **kw: Any):
        super().__init__(kind, **kw)


class StandinServer:
    """The engine behind an HTTP server on 127.0.0.1 (a daemon thread: it goes with its process). ``hostile``:
    ``"garbage"`` (non-JSON replies with status 200), ``"500"`` (every profiling route answers 500),
    ``"escape"`` (each rank's trace is a link to a file outside the output folder)."""

    def __init__(self, kind: str = "sglang", hostile: str | None = None, **kw: Any):
        self.engine = StandinEngine(kind, **kw)
        self.hostile = hostile
        self.kind = kind
        self.requests: list[tuple[str, Any]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, name="standin-http", daemon=True).start()

    def kill(self) -> None:
        """The engine dies: its workers are killed and the server stops answering."""
        self.engine.kill()
        self._httpd.shutdown()
        self._httpd.server_close()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self.engine.close()

    def __enter__(self) -> StandinServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _handler(server: StandinServer):
    engine, contract = server.engine, server.engine.contract

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _reply(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            return json.loads(raw) if raw else None

        def do_GET(self) -> None:
            if self.path == contract.version_path:
                self._reply(200, json.dumps({"version": engine.version}).encode(), "application/json")
            else:
                self._reply(404, b'{"detail":"Not Found"}', "application/json")

        def do_POST(self) -> None:
            try:
                body = self._body()
            except ValueError:
                self._reply(400, b"bad JSON")
                return
            server.requests.append((self.path, body))
            if self.path == "/generate":
                n = int((body or {}).get("iterations", 4))
                self._reply(200, json.dumps({"text": f"{engine.generate(n):.3f}", "iterations": n}).encode(),
                            "application/json")
                return
            if self.path not in (contract.start_path, contract.stop_path) or (
                    engine.kind == "vllm" and not engine.trace_dir):
                self._reply(404, b'{"detail":"Not Found"}', "application/json")  # vLLM: no profiler configured
                return
            if server.hostile == "500":
                self._reply(500, b"Internal Server Error")
                return
            if self.path == contract.start_path:
                fields = body if engine.kind == "sglang" and isinstance(body, dict) else {}
                engine.start_profile(fields.get("output_dir"), fields.get("num_steps"))
                ok = contract.start_reply
            else:
                was = engine.stop_profile()
                if server.hostile == "escape":
                    _escape(engine)
                if not was and engine.kind == "sglang":
                    self._reply(400, b"Profiling is not in progress.\n")
                    return
                ok = contract.stop_reply
            self._reply(200, b"\x00{not json" if server.hostile == "garbage" else ok)

    return Handler


def _escape(engine: StandinEngine) -> None:
    """Hostile: replace each trace just written by a link pointing outside its folder."""
    import glob

    root = engine.last_out or "/tmp"
    for path in glob.glob(os.path.join(root, "*.trace.json.gz")):
        outside = os.path.join(os.path.dirname(root), "outside-" + os.path.basename(path))
        os.replace(path, outside)
        os.symlink(outside, path)
