"""The one directory walker (rundir/walk.py) and its symlink policies, and the walkers built on it agreeing."""

import os

import fsspec
import pytest

from distprof.analysis.runview import RunView
from distprof.integrations.ray.collect import _pending
from distprof.rundir.layout import TMP_PREFIX
from distprof.rundir.store import list_files
from distprof.rundir.walk import TooDeep, walk
from distprof.trace.listing import find_traces


def _tree(tmp_path):
    """root/{a/x.json, b/y.json, b/to_a -> ../a, b/out -> outside/, dangling -> nowhere, loop -> ., fifo}"""
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "x.json").write_text("{}")
    (root / "b" / "y.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    (root / "b" / "to_a").symlink_to("../a")
    (root / "b" / "out").symlink_to(outside)
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "loop").symlink_to(".")
    os.mkfifo(root / "fifo")
    return root


def _kinds(folders):
    return {e.rel: e.kind for f in folders for e in f.entries}


def test_report_follows_links_inside_once_and_names_the_others(tmp_path):
    root = _tree(tmp_path)
    folders = list(walk(str(root), links="report"))
    assert [f.rel for f in folders] == ["", "a", "b"]  # b/to_a and loop lead to folders walked already
    kinds = _kinds(folders)
    assert kinds == {"a": "dir", "a/x.json": "file", "b": "dir", "b/y.json": "file", "b/to_a": "dir",
                     "b/out": "outside", "dangling": "broken", "loop": "dir", "fifo": "other"}
    dangling = next(e for f in folders for e in f.entries if e.name == "dangling")
    assert dangling.link and isinstance(dangling.error, FileNotFoundError)


def test_skip_never_follows_a_link(tmp_path):
    root = _tree(tmp_path)
    folders = list(walk(str(root), links="skip"))
    assert [f.rel for f in folders] == ["", "a", "b"]
    kinds = _kinds(folders)
    assert {r for r, k in kinds.items() if k == "link"} == {"b/to_a", "b/out", "dangling", "loop"}
    assert all(e.st is None for f in folders for e in f.entries if e.kind == "link")  # not even looked through


def test_a_folder_met_first_through_a_link_is_walked_there_for_every_caller(tmp_path):
    """One walker, one answer: the reader and check see a folder reached by a link at the same path."""
    root = tmp_path / "root"
    (root / "b").mkdir(parents=True)
    (root / "c").mkdir()
    (root / "c" / "rank-0.pt.trace.json").write_text('{"traceEvents": []}')
    (root / "b" / "x").symlink_to("../c")
    found = [os.path.relpath(t.path, root) for t in find_traces(str(root), [])]
    view = RunView(str(root))
    assert view.root_kind() == "dir"
    listed = [f"{d}/{n}" if d else n for d, _, files in view.walk() for n in files]
    assert found == listed == ["c/rank-0.pt.trace.json"]  # (check alone said b/x/... before it used the walker)


def test_list_files_and_pending_keep_their_policy(tmp_path):
    root = _tree(tmp_path)
    (root / f"{TMP_PREFIX}{os.getpid()}-w.json").write_text("{}")
    (root / f"{TMP_PREFIX}{os.getpid()}-dir").mkdir()
    (root / f"{TMP_PREFIX}{os.getpid()}-dir" / "z.json").write_text("{}")
    assert [f["path"] for f in list_files(str(root))] == ["a/x.json", "b/y.json"]  # no link, no temporary, no FIFO
    assert sorted(p for p, _ in _pending(str(root))) == sorted([f"{TMP_PREFIX}{os.getpid()}-dir",
                                                               f"{TMP_PREFIX}{os.getpid()}-w.json"])


def test_the_walk_is_bounded_in_depth(tmp_path):
    d = tmp_path / "deep"
    for _ in range(5):
        d = d / "d"
    d.mkdir(parents=True)
    errors = []
    folders = list(walk(str(tmp_path / "deep"), links="report", max_depth=2,
                        on_error=lambda p, rel, e: errors.append((rel, e))))
    assert [f.rel for f in folders] == ["", "d", "d/d"]
    assert [rel for rel, _ in errors] == ["d/d"] and isinstance(errors[0][1], TooDeep)


def test_a_store_is_walked_alike_and_its_errors_reported():
    fs = fsspec.filesystem("memory")
    fs.pipe("/walkme/a/x.json", b"{}")
    fs.pipe("/walkme/b/y.json", b"{}")
    fs.pipe("/walkme/.hidden/z.json", b"{}")
    folders = list(walk("/walkme", links="report", fs=fs, skip=lambda n: n.startswith(".")))
    assert [f.rel for f in folders] == ["", "a", "b"]
    assert _kinds(folders) == {"a": "dir", "a/x.json": "file", "b": "dir", "b/y.json": "file"}
    assert folders[0].names == [".hidden", "a", "b"]

    class Broken(type(fs)):
        def ls(self, path, detail=True, **kw):
            if path.rstrip("/").endswith("/b"):
                raise PermissionError(13, "denied", path)
            return super().ls(path, detail=detail, **kw)

    errors = []
    folders = list(walk("/walkme", links="skip", fs=Broken(), on_error=lambda p, rel, e: errors.append(rel)))
    assert errors == ["b"] and [f.rel for f in folders] == ["", ".hidden", "a"]
    fs.rm("/walkme", recursive=True)


def test_a_policy_must_be_named():
    with pytest.raises(ValueError, match="links="):
        walk(".", links="follow")  # type: ignore[arg-type]
