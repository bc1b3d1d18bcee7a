"""tests/jobs/warmpython.py gives a job what ``python SCRIPT`` gives it (the crash, chaos and logging tests rely on
it): its own process, streams, arguments, environment, folder, ``__main__``, exit status, signals and the end of
an interpreter. Each check here is made against a real ``python`` too: both must agree."""

import os
import signal
import subprocess
import sys

import pytest
import warmpython

JOB = r"""
import atexit, json, os, sys, threading
atexit.register(lambda: print("atexit", flush=True))
# A thread that outlives the script: the interpreter's end waits for it, then runs atexit.
threading.Thread(target=lambda: (threading.main_thread().join(), print("thread joined", flush=True))).start()
print(json.dumps({"argv": sys.argv, "name": __name__, "main": sys.modules["__main__"].__dict__ is globals(),
                  "file": globals().get("__file__"), "path0": sys.path[0], "cwd": os.getcwd(),
                  "env": os.environ.get("WARM_TEST"), "stdin": sys.stdin.readline().strip(),
                  "pythonpath_first": [p for p in sys.path if p.endswith("extra-folder")]}), flush=True)
how = sys.argv[1]
if how == "raise":
    raise RuntimeError("boom")
if how == "exit":
    sys.exit(3)
if how == "wait":
    print("ready", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def both(args, **kw):
    """The same command through a real python and a warm one."""
    return [start(args, **kw) for start in (subprocess.run, warmpython.run)]


@pytest.mark.slow
@pytest.mark.parametrize("how, status", [("ok", 0), ("raise", 1), ("exit", 3)])
def test_a_job_ends_as_python_ends_it(script, tmp_path, how, status):
    env = {**os.environ, "WARM_TEST": "yes", "PYTHONPATH": str(tmp_path / "extra-folder")}
    real, warm = both([sys.executable, str(script), how], input="hello\n", capture_output=True, text=True,
                      env=env, cwd=tmp_path, timeout=120)
    assert real.returncode == warm.returncode == status, warm.stderr
    assert real.stdout == warm.stdout
    assert '"name": "__main__", "main": true' in warm.stdout and '"stdin": "hello"' in warm.stdout
    assert f'"path0": "{tmp_path}"' in warm.stdout and '"env": "yes"' in warm.stdout
    assert warm.stdout.splitlines()[-2:] == ["thread joined", "atexit"]
    assert ("RuntimeError: boom" in warm.stderr) is (how == "raise")


@pytest.mark.slow
def test_python_c_sees_its_arguments_as_python_gives_them(tmp_path):
    code = "import sys; print(sys.argv, __name__, repr(sys.path[0]))"
    real, warm = both([sys.executable, "-c", code, "a", "b"], capture_output=True, text=True, cwd=tmp_path)
    assert real.stdout == warm.stdout == "['-c', 'a', 'b'] __main__ ''\n"


@pytest.mark.slow
def test_a_signal_ends_the_job_with_its_number_and_a_timeout_can_be_waited_again(script, tmp_path):
    proc = warmpython.Popen([sys.executable, str(script), "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    proc.stdin.write("x\n")
    proc.stdin.flush()
    assert proc.stdout.readline().startswith("{") and proc.stdout.readline().strip() == "ready"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM and proc.poll() == -signal.SIGTERM
    proc.stdin.close()
    proc.stdout.close()


def test_only_python_script_or_c_is_taken():
    with pytest.raises(ValueError, match="python SCRIPT"):
        warmpython.Popen([sys.executable, "-O", "x.py"])
