"""Process-wrapping backends: option rendering, capture ranges, the wrapper's launch and finalization."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import JOBS

from distprof import ProfilerConfig
from distprof.capture.backends.process import WrapSpec, check_tool, output_name, render_options, tool_command
from distprof.capture.wrap import finalize_outputs
from distprof.config.process_tools import nsys_capture_options
from distprof.integrations.ray import runtime_env

FAKE_NSYS = os.path.join(JOBS, "fake_nsys.py")


def test_render_options_rlinf_rules():
    assert render_options({"t": "cuda,nvtx", "sample": "process-tree", "o": 3, "stop-on-exit": True},
                          ["python-backtrace", "x"]) == [
        "-t", "cuda,nvtx", "--sample=process-tree", "-o", "3", "--stop-on-exit=true", "--python-backtrace", "-x"]


@pytest.mark.parametrize("kw, windows, end", [
    (dict(steps=[3]), 1, "repeat:1"),
    (dict(steps=[3, 4, 10, 20]), 3, "repeat:3"),
    (dict(schedule={"active": 2, "repeat": 2}), 2, "repeat:2"),
    (dict(schedule={"active": 1, "repeat": 0}), None, "repeat"),
])
def test_nsys_capture_range_covers_every_window(kw, windows, end):
    c = ProfilerConfig(backend="nsys", **kw)
    assert c.window_count() == windows
    opts = nsys_capture_options(c.nsys.options, c.window_count(), c.whole_lifetime)
    assert opts["capture-range"] == "cudaProfilerApi" and opts["capture-range-end"] == end
    assert opts["t"] == "cuda,cudnn,cublas,nvtx"  # defaults kept


def test_nsys_whole_lifetime_has_no_capture_range():
    c = ProfilerConfig(backend="nsys")
    assert c.whole_lifetime and c.plan().describe() == "whole lifetime"
    assert "capture-range" not in nsys_capture_options(c.nsys.options, None, True)


def test_nsys_capture_range_end_that_would_drop_windows_is_refused():
    with pytest.raises(ValueError, match="records only the first of 2 windows"):
        nsys_capture_options({"capture-range-end": "stop"}, 2, False)
    with pytest.raises(ValueError, match="stops after 1 ranges but the plan has 3 windows"):
        nsys_capture_options({"capture-range-end": "repeat:1"}, 3, False)
    kept = nsys_capture_options({"capture-range": "nvtx", "capture-range-end": "repeat:5"}, 3, False)
    assert kept == {"capture-range": "nvtx", "capture-range-end": "repeat:5"}


@pytest.mark.parametrize("section, bad, words", [
    ("nsys", {"options": {"-t": "cuda"}}, ["'-t'", "without dashes"]),
    ("nsys", {"options": {"t": ["a", "b"]}}, ["single value", "flags"]),
    ("py_spy", {"flags": ["bad flag"]}, ["'bad flag'"]),
    ("memray", {"env": {"1X": "y"}}, ["'1X'"]),
    ("py_spy", {"rate": "fast"}, ["rate"]),
    ("py_spy", {"format": "pdf"}, ["format"]),
    ("cuda_memory", {"max_entries": 0}, ["max_entries", "0"]),
    ("cuda_memory", {"stacks": "cpp"}, ["stacks"]),
])
def test_backend_option_validation(section, bad, words):
    with pytest.raises(ValueError) as e:
        ProfilerConfig(**{section: bad})
    for w in words:
        assert w in str(e.value)


def _spec(backend, tmp_path, **kw):
    base = dict(backend=backend, group="rollout", out_dir=str(tmp_path / "rollout"), python=["/venv/bin/python"],
                executable=None)
    base.update(kw)
    return WrapSpec(**base)


def test_tool_commands(tmp_path):
    args = ["default_worker.py", "--node-ip-address=127.0.0.1"]
    out = str(tmp_path / "rollout")
    argv, env = tool_command(_spec("py_spy", tmp_path, extra={"rate": 50, "format": "chrometrace", "native": True}), 42, args)
    assert argv == ["py-spy", "record", "-r", "50", "-f", "chrometrace", "-o", f"{out}/.tmp-42-py_spy-pid42.chrometrace.json",
                    "--native", "--", "/venv/bin/python", *args]
    argv, _ = tool_command(_spec("memray", tmp_path, options={"trace-python-allocators": True}), 42, args)
    assert argv == ["/venv/bin/python", "-m", "memray", "run", "-q", "-f", "-o", f"{out}/.tmp-42-memray-pid42.bin",
                    "--trace-python-allocators=true", *args]
    argv, _ = tool_command(_spec("nsys", tmp_path, executable="/opt/nsys", options={"t": "cuda"}, flags=["cuda-memory-usage"]), 42, args)
    assert argv == ["/opt/nsys", "profile", "-o", f"{out}/.tmp-42-nsys-pid42", "--force-overwrite=true", "-t", "cuda",
                    "--cuda-memory-usage", "/venv/bin/python", *args]
    argv, env = tool_command(_spec("rocprof_sys", tmp_path, options={"T": "hip"}, env={"ROCPROFSYS_SAMPLING_FREQ": "100"}), 42, args)
    assert argv == ["rocprof-sys-python", "-T", "hip", "--", "/venv/bin/python", *args]
    assert env == {"ROCPROFSYS_OUTPUT_PATH": f"{out}/.tmp-42-rocprof_sys-pid42", "ROCPROFSYS_OUTPUT_PREFIX": "",
                   "ROCPROFSYS_SAMPLING_FREQ": "100"}
    assert output_name(_spec("py_spy", tmp_path), 7) == "py_spy-pid7.speedscope.json"


def test_spec_survives_the_shell(tmp_path):
    spec = _spec("nsys", tmp_path, options={"o": "it's \"quoted\" $HOME"}, python=["/my env/python"])
    line = spec.py_executable(["/my env/python"])
    words = shlex.split(line)
    assert words[:3] == ["/my env/python", "-m", "distprof.capture.wrap"]
    assert WrapSpec.decode(words[3]) == spec


def test_finalize_renames_only_this_pids_outputs(tmp_path):
    (tmp_path / ".tmp-5-nsys-pid5.nsys-rep").write_text("x")
    (tmp_path / ".tmp-6-nsys-pid6.nsys-rep").write_text("y")
    assert finalize_outputs(str(tmp_path), 5) == ["nsys-pid5.nsys-rep"]
    assert sorted(os.listdir(tmp_path)) == [".tmp-6-nsys-pid6.nsys-rep", "nsys-pid5.nsys-rep"]


def test_check_tool(tmp_path):
    with pytest.raises(ValueError, match="'nsys' needs 'nsys', which is not on PATH; install Nsight Systems"):
        check_tool("nsys", None, [sys.executable])
    with pytest.raises(ValueError, match="needs '/nope/rocprof'"):
        check_tool("rocprof_sys", "/nope/rocprof", [sys.executable])
    # py-spy is found beside the interpreter even when the venv is not on PATH.
    assert check_tool("py_spy", None, [sys.executable]).endswith("py-spy")
    assert check_tool("memray", None, [sys.executable]) is None
    with pytest.raises(ValueError, match="memray package"):
        check_tool("memray", None, ["/bin/false"])


def test_runtime_env_leaves_unselected_groups_alone(tmp_path):
    base = {"env_vars": {"A": "1"}, "py_executable": "/x/python"}
    on = dict(enable=True, save_path=str(tmp_path), backend="py_spy")
    assert runtime_env(ProfilerConfig(**{**on, "enable": False}), group="actor", base=base) == base
    assert runtime_env(ProfilerConfig(**{**on, "backend": "torch"}), group="actor", base=base) == base
    assert runtime_env(ProfilerConfig(**on, roles=["rollout"]), group="actor", base=base) == base
    assert runtime_env(ProfilerConfig(**on, ranks=[0]), group="actor", base=base, rank=1) == base


def test_runtime_env_wraps_and_keeps_interpreter_and_env(tmp_path):
    py = sys.executable
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "p"), backend="nsys", steps=[2, 5],
                         nsys={"executable": FAKE_NSYS, "options": {"t": "cuda,nvtx"}, "env": {"NSYS_X": "1"}})
    env = runtime_env(cfg, group="actor", base={"env_vars": {"A": "1"}, "py_executable": f"{py} -X utf8"})
    assert env["env_vars"] == {"A": "1"}
    words = shlex.split(env["py_executable"])
    assert words[:5] == [py, "-X", "utf8", "-m", "distprof.capture.wrap"]
    spec = WrapSpec.decode(words[5])
    assert spec.python == [py, "-X", "utf8"] and spec.out_dir == str(tmp_path / "p" / "actor")
    assert spec.options == {"t": "cuda,nvtx", "capture-range": "cudaProfilerApi", "capture-range-end": "repeat:2"}
    assert spec.env == {"NSYS_X": "1"} and spec.executable == FAKE_NSYS


def test_runtime_env_refuses_url_save_path_and_missing_tool(tmp_path):
    with pytest.raises(ValueError, match="is a URL"):
        runtime_env(ProfilerConfig(enable=True, save_path="memory://x", backend="py_spy"), group="a")
    with pytest.raises(ValueError, match="needs 'nsys'"):
        runtime_env(ProfilerConfig(enable=True, save_path=str(tmp_path), backend="nsys"), group="a")


def settled(directory):
    """Names in ``directory`` once every finalizer there is done (as collect() waits)."""
    from distprof.integrations.ray.collect import _node_list

    listing = _node_list(str(directory), 30, [])
    assert listing["pending"] == []
    return sorted(os.path.basename(f["path"]) for f in listing["files"])


# The app reports on stderr: py-spy prints its banner on stdout, and lines there can interleave.
APP = "import os, sys, time\nprint('app running', os.getpid(), file=sys.stderr, flush=True)\n{body}\n"


def _wrapper(spec, app_body, tmp_path, **kw):
    script = tmp_path / "app.py"
    script.write_text(APP.format(body=app_body))
    return subprocess.Popen([sys.executable, "-m", "distprof.capture.wrap", spec.encode(), str(script)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


@pytest.fixture
def reap(tmp_path):
    """Kill every process a test started, whatever the test's outcome: the wrapper's session, and the
    tool and app (in their own session) found by the test's directory on their command lines."""
    procs = []
    yield procs.append
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["pkill", "-9", "-f", str(tmp_path)], check=False)


def test_wrapper_with_stand_in_nsys_finalizes_at_exit(tmp_path):
    """nsys cannot run here; a stand-in with its interface and signal behaviour runs instead."""
    spec = _spec("nsys", tmp_path, executable=FAKE_NSYS, python=[sys.executable], options={"t": "cuda"})
    proc = _wrapper(spec, "x = sum(range(1000))", tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "app running" in err
    name = f"nsys-pid{proc.pid}.nsys-rep"
    assert settled(tmp_path / "rollout") == [name]
    report = json.loads((tmp_path / "rollout" / name).read_text())
    assert report["options"] == ["--force-overwrite=true", "-t", "cuda"] and report["app"][0] == sys.executable


@pytest.mark.parametrize("backend", ["nsys", "py_spy"])
def test_wrapper_turns_sigterm_into_a_written_output(tmp_path, backend, reap):
    """SIGTERM to the wrapper (a scheduler ending the job) must still leave a finished output:
    py-spy and nsys write nothing on SIGTERM, so the wrapper sends them SIGINT."""
    spec = _spec(backend, tmp_path, python=[sys.executable],
                 executable=FAKE_NSYS if backend == "nsys" else check_tool("py_spy", None, [sys.executable]), extra={"rate": 200, "format": "speedscope"})
    proc = _wrapper(spec, "end = time.time() + 120\nwhile time.time() < end: sum(range(10000))", tmp_path)
    reap(proc)
    assert any("app running" in line for line in iter(proc.stderr.readline, ""))
    proc.send_signal(signal.SIGTERM)  # as early as possible: the wrapper must still get a written output
    proc.wait(timeout=60)
    files = settled(tmp_path / "rollout")
    assert len(files) == 1 and not files[0].startswith(".tmp-") and f"pid{proc.pid}" in files[0]
    data = json.loads((tmp_path / "rollout" / files[0]).read_text())
    if backend == "py_spy":
        assert "speedscope" in data["$schema"] and "profiles" in data  # finalized (samples depend on timing)


def test_wrapper_with_stand_in_rocprof_sys(tmp_path):
    """rocprof-sys cannot run here; a stand-in with its interface writes a result directory."""
    spec = _spec("rocprof_sys", tmp_path, executable=os.path.join(JOBS, "fake_rocprof_sys.py"), python=[sys.executable],
                 options={"T": "hip"}, env={"ROCPROFSYS_SAMPLING_FREQ": "100"})
    proc = _wrapper(spec, "x = 1", tmp_path)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    out = tmp_path / "rollout" / f"rocprof_sys-pid{proc.pid}"
    assert settled(tmp_path / "rollout") == ["wall_clock.json"]  # the hidden directory was renamed when the tool ended
    assert os.listdir(tmp_path / "rollout") == [out.name]
    result = json.loads((out / "wall_clock.json").read_text())
    assert result["options"] == ["-T", "hip"] and result["sampling_freq"] == "100"


def test_wrapper_runs_worker_unwrapped_when_tool_cannot_start(tmp_path):
    spec = _spec("nsys", tmp_path, executable=str(tmp_path / "missing-nsys"), python=[sys.executable])
    proc = _wrapper(spec, "print('done', file=sys.stderr, flush=True)", tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "done" in err


def test_output_finalized_even_when_the_wrapper_is_killed(tmp_path, reap):
    """When a worker dies, Ray also SIGKILLs the process it started (the wrapper), maybe before the tool
    has written. The detached finalizer must still leave a finished output."""
    from distprof.integrations.ray.collect import _node_list

    spec = _spec("py_spy", tmp_path, executable=check_tool("py_spy", None, [sys.executable]), python=[sys.executable],
                 extra={"rate": 200, "format": "speedscope"})
    proc = _wrapper(spec, "end = time.time() + 120\nwhile time.time() < end: sum(range(10000))", tmp_path)
    reap(proc)
    line = next(line for line in iter(proc.stderr.readline, "") if "app running" in line)
    app_pid = int(re.search(r"app running (\d+)", line).group(1))
    # In Ray the worker dies long after start. Here: once py-spy samples (its SIGINT handler is in place; a
    # child killed before that leaves py-spy nothing to write) and the wrapper has started its finalizer.
    from distprof.util.procfs import handles_signal as _handles

    with open(f"/proc/{app_pid}/stat") as f:
        pyspy_pid = int(f.read().rsplit(")", 1)[1].split()[1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
            _handles(pyspy_pid, signal.SIGINT) and any(n.endswith("-finalizer") for n in os.listdir(tmp_path / "rollout"))):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # the wrapper, as raylet kills it
    os.kill(app_pid, signal.SIGKILL)  # the worker
    proc.wait(timeout=30)
    listing = _node_list(str(tmp_path), 60, [])  # waits while the finalizer's marker is there
    assert listing["pending"] == []
    assert [f["path"] for f in listing["files"] if f["path"].startswith("rollout/")] == [
        f"rollout/py_spy-pid{proc.pid}.speedscope.json"]
    assert "profiles" in json.loads((tmp_path / "rollout" / f"py_spy-pid{proc.pid}.speedscope.json").read_text())


def test_collect_waits_as_long_as_the_process_backends_finalize_timeout(tmp_path):
    """``finalize_timeout_s`` is what collect() waits for outputs still being written (it was once ignored)."""
    from distprof.integrations.ray.collect import DEFAULT_FINALIZE_TIMEOUT_S, finalize_timeout
    from distprof.integrations.ray.workers import ProfiledGroup

    def group(backend, role, **section):
        cfg = {"enable": True, "backend": backend, "save_path": str(tmp_path), "roles": ["nobody"],  # no Ray calls
               **({backend: section} if section else {})}
        return ProfiledGroup([], cfg, role)

    assert finalize_timeout([group("py_spy", "rollout", finalize_timeout_s=7.5),
                             group("memray", "actor", finalize_timeout_s=30)]) == 30
    assert finalize_timeout([group("torch", "actor")]) == DEFAULT_FINALIZE_TIMEOUT_S
    assert finalize_timeout([group("py_spy", "actor")]) == 120.0  # the field's default
