"""Process-wrapping backends (nsys, rocprof_sys, py_spy, memray): what the wrapper runs.

Command rendering (pure) and :func:`check_tool` (is the tool installed here; looks on PATH and asks the
workers' interpreter for memray). Running the tool and publishing its output is ``distprof/capture/wrap.py``'s job;
what /proc says about processes is ``distprof/util/procfs.py``'s.

A wrapped worker is started by Ray as ``<py_executable> default_worker.py ARGS``.
distprof sets ``py_executable`` to ``<python> -m distprof.capture.wrap SPEC``; the
wrapper (``distprof/capture/wrap.py``) turns SPEC plus Ray's arguments into the tool's
command line with the functions below, runs it, and finalizes the output.

Outputs go to ``{save_path}/{group}/{backend}-pid{PID}{ext}`` (``...-pid{PID}.rank{R:05d}{ext}`` under
``distprof wrap``, which knows the rank: ``distprof/capture/wrapjob.py``) where PID is the
wrapper's pid (the worker is its child; ``os.getppid()`` in the worker, or its
grandparent under py-spy). Tools write to a hidden ``.tmp-{PID}-`` name that
the wrapper renames once the tool has exited, so a visible output is complete.
Nothing here imports torch or ray.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from distprof.config.process_tools import nsys_capture_options
from distprof.rundir.layout import process_output_name, temp_name

__all__ = ["DEFAULT_EXECUTABLES", "WrapSpec", "output_name", "render_options", "spec_for", "tool_command"]

DEFAULT_EXECUTABLES = {"nsys": "nsys", "rocprof_sys": "rocprof-sys-python", "py_spy": "py-spy", "memray": None}
PY_SPY_EXT = {"speedscope": ".speedscope.json", "chrometrace": ".chrometrace.json", "raw": ".txt", "flamegraph": ".svg"}


def _fmt(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def render_options(options: Mapping[str, Any], flags: Sequence[str] = ()) -> list[str]:
    """RLinf's rules: ``-k v`` for one-letter keys, ``--key=v`` for longer ones, ``--flag`` for flags."""
    out: list[str] = []
    for k, v in options.items():
        if len(k) == 1:
            out += [f"-{k}", _fmt(v)]
        else:
            out.append(f"--{k}={_fmt(v)}")
    for f in flags:
        out.append(f"-{f}" if len(f) == 1 else f"--{f}")
    return out


@dataclass(frozen=True)
class WrapSpec:
    """Everything the wrapper needs, passed on its command line (base64 JSON: no shell quoting issues)."""

    backend: str
    group: str
    out_dir: str  # {save_path}/{group}, on the worker's node
    python: list[str]  # the worker's interpreter command (a uv / venv / conda one is kept)
    executable: str | None
    options: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # backend specifics (py-spy rate/format, native)
    rank: int | None = None  # the rank ``distprof wrap`` wraps (named in the output); None: a Ray worker

    def encode(self) -> str:
        return base64.urlsafe_b64encode(json.dumps(asdict(self)).encode()).decode()

    @classmethod
    def decode(cls, text: str) -> WrapSpec:
        return cls(**json.loads(base64.urlsafe_b64decode(text.encode())))

    def py_executable(self, wrapper_python: list[str]) -> str:
        """The string Ray runs as ``exec <this> default_worker.py ...``."""
        return shlex.join([*wrapper_python, "-m", "distprof.capture.wrap", self.encode()])


def output_name(spec: WrapSpec, pid: int) -> str:
    """Final output name (without nsys's own ``.nsys-rep`` suffix) for the wrapper with this pid."""
    ext = {"py_spy": PY_SPY_EXT[spec.extra.get("format", "speedscope")], "memray": ".bin"}.get(spec.backend, "")
    return process_output_name(spec.backend, pid, ext, spec.rank)


def spec_for(config: Any, group: str, out_dir: str, python: list[str], rank: int | None = None) -> WrapSpec:
    """The WrapSpec of ``config`` (a ProfilerConfig, already resolved for the role ``group``, with a process
    backend): its tool (checked here: ValueError naming it when missing), options (nsys: the capture range over
    the planned windows), flags, env and specifics. The Ray path (``runtime_env``) and ``distprof wrap`` both
    build their spec here."""
    section = getattr(config, config.backend)
    executable = check_tool(config.backend, section.executable, python)
    options = dict(section.options)
    if config.backend == "nsys":
        options = nsys_capture_options(options, config.window_count(), config.whole_lifetime)
    extra: dict[str, Any] = {}
    if config.backend == "py_spy":
        extra = {"rate": section.rate, "format": section.format, "native": section.native,
                 "subprocesses": section.subprocesses}
    elif config.backend == "memray":
        extra = {"native": section.native}
    return WrapSpec(backend=config.backend, group=group, out_dir=out_dir, python=python, executable=executable,
                    options=options, flags=list(section.flags), env=dict(section.env), extra=extra, rank=rank)


def tool_command(spec: WrapSpec, pid: int, worker_args: list[str],
                 attach_pid: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The tool's argv and extra environment for one wrapped worker; ``attach_pid`` (py-spy only): the worker runs
    already, as that process, and the tool attaches to it."""
    tmp = os.path.join(spec.out_dir, temp_name(pid, output_name(spec, pid)))
    opts = render_options(spec.options, spec.flags)
    env = dict(spec.env)
    exe = spec.executable or DEFAULT_EXECUTABLES[spec.backend] or ""  # "": memray runs in the interpreter
    if spec.backend == "py_spy":
        cmd = [exe, "record", "-r", str(spec.extra.get("rate", 100)), "-f", spec.extra.get("format", "speedscope"),
               "-o", tmp]
        if spec.extra.get("native"):
            cmd.append("--native")
        if spec.extra.get("subprocesses"):
            cmd.append("--subprocesses")
        if attach_pid is not None:
            return [*cmd, *opts, "--pid", str(attach_pid)], env
        return [*cmd, *opts, "--", *spec.python, *worker_args], env
    if spec.backend == "memray":
        cmd = [*spec.python, "-m", "memray", "run", "-q", "-f", "-o", tmp]
        if spec.extra.get("native"):
            cmd.append("--native")
        return [*cmd, *opts, *worker_args], env
    if spec.backend == "nsys":
        return [exe, "profile", "-o", tmp, "--force-overwrite=true", *opts, *spec.python, *worker_args], env
    if spec.backend == "rocprof_sys":
        # rocprof-sys writes a directory of results; point it at a hidden one the wrapper renames.
        env = {"ROCPROFSYS_OUTPUT_PATH": tmp, "ROCPROFSYS_OUTPUT_PREFIX": "", **env}
        return [exe, *opts, "--", *spec.python, *worker_args], env
    raise ValueError(f"backend {spec.backend!r} does not wrap processes")


def check_tool(backend: str, executable: str | None, python: list[str]) -> str | None:
    """The tool's resolved path (None for memray, which runs in the interpreter).

    Looks on PATH and beside the workers' interpreter (where pip puts py-spy in a venv).
    Raises ValueError naming the tool when it cannot be found here.
    """
    if backend == "memray":
        import subprocess

        # The answer must come from Python importing memray (``distprof wrap``'s command may be no interpreter at all).
        probe = subprocess.run([*python, "-c", "import memray; print('memray-ok')"], capture_output=True)
        if probe.returncode != 0 or probe.stdout.strip() != b"memray-ok":
            raise ValueError(
                f"backend 'memray' needs the memray package in the workers' interpreter ({shlex.join(python)}); "
                "pip install memray there"
            )
        return None
    exe = executable or DEFAULT_EXECUTABLES[backend] or backend  # (memray returned above)
    # pip puts tools beside an interpreter: the workers' one, or this process's (the tool runs outside the worker).
    beside = os.pathsep.join(os.path.dirname(shutil.which(p) or p) for p in (python[0], sys.executable))
    found = shutil.which(exe) or shutil.which(exe, path=beside)
    if found is None:
        hint = {"nsys": "install Nsight Systems", "rocprof_sys": "install ROCm Systems Profiler",
                "py_spy": "pip install py-spy"}[backend]
        raise ValueError(f"backend {backend!r} needs {exe!r}, which is not on PATH; {hint} or set {backend}.executable")
    return os.path.abspath(found)
