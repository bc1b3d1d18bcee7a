"""One writer: every temporary-then-rename in src/ goes through rundir/safefile.py."""

import os
import pathlib
import re

import pytest
from conftest import REPO

from distprof.capture.backends import cuda_memory
from distprof.capture.backends.base import WindowContext
from distprof.capture.wrap import finalize_outputs
from distprof.config.model import CudaMemoryOptions
from distprof.config.plan import Window
from distprof.rundir import safefile
from distprof.rundir.safefile import UnsafePath, replace

SRC = pathlib.Path(REPO) / "src" / "distprof"
# The demo's hostile engine stand-in moves a trace out of its folder on purpose (to plant a link in its place).
ALLOWED = {"rundir/safefile.py", "demo/engine_standin.py"}


def test_no_rename_in_src_bypasses_safefile():
    calls = re.compile(r"\bos\.(replace|rename|renames)\(|\b(mkstemp|NamedTemporaryFile)\(")
    found = [f"{p.relative_to(SRC)}:{n}" for p in SRC.rglob("*.py") if str(p.relative_to(SRC)) not in ALLOWED
             for n, line in enumerate(p.read_text().splitlines(), 1) if calls.search(line)]
    assert found == []


def test_replace_renames_in_the_folder_and_never_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / ".tmp-1-a").write_text("new")
    (folder / "a").symlink_to(victim)
    replace(str(folder / ".tmp-1-a"), str(folder / "a"))
    assert (folder / "a").read_text() == "new" and not (folder / "a").is_symlink() and victim.read_text() == "keep"
    with pytest.raises(FileNotFoundError):  # renamed already (the wrapper and its finalizer race)
        replace(str(folder / ".tmp-1-a"), str(folder / "a"))
    (tmp_path / ".tmp-1-b").write_text("x")
    with pytest.raises(UnsafePath, match="must sit in its destination's folder"):
        replace(str(tmp_path / ".tmp-1-b"), str(folder / "b"))


def _recorded(monkeypatch, module):
    seen = []

    def rec(tmp, final):
        seen.append((os.path.basename(tmp), os.path.basename(final)))
        return safefile.replace(tmp, final)

    monkeypatch.setattr(module, "replace", rec)
    return seen


def test_the_oom_snapshot_without_a_run_directory_is_renamed_by_safefile(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    seen = _recorded(monkeypatch, cuda_memory)
    monkeypatch.setattr(cuda_memory, "_dump", lambda torch, path: pathlib.Path(path).write_bytes(b"snapshot"))
    b = cuda_memory.CudaMemoryBackend(CudaMemoryOptions())
    b._ctx = WindowContext(role="actor", rank=0, world_size=1,
                           tmp_path=lambda n: safefile.temp_path(str(tmp_path), n), publish_now=None)
    b._window, b._step = Window(start=3, end=4, warmup_start=3), 4
    b._dump_oom()
    [(tmp, final)] = seen
    assert tmp.startswith(".tmp-") and final.startswith("oom-") and (tmp_path / final).read_bytes() == b"snapshot"
    assert os.listdir(tmp_path) == [final]


def test_a_tools_outputs_are_renamed_by_safefile(tmp_path, monkeypatch):
    from distprof.capture import wrap

    seen = _recorded(monkeypatch, wrap)
    (tmp_path / ".tmp-5-nsys-pid5.nsys-rep").write_text("x")
    assert finalize_outputs(str(tmp_path), 5) == ["nsys-pid5.nsys-rep"]
    assert seen == [(".tmp-5-nsys-pid5.nsys-rep", "nsys-pid5.nsys-rep")]
