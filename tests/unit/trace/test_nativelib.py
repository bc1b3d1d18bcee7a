"""Finding and loading the native decoder's library (distprof.trace.nativelib): switched off, missing, not a
library, another ABI: each one line saying why, never a traceback; and where cargo is installed the install built
it, so it loads here (no skip hides a missing build)."""

import ctypes
import os
import shutil
import subprocess

import pytest
from conftest import REPO

from distprof.trace import nativelib
from distprof.util.envvars import NATIVE, NATIVE_LIB, NOT_SETTINGS


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test loads afresh from its own environment, and leaves the process's answer as it found it."""
    monkeypatch.delenv(NATIVE, raising=False)
    monkeypatch.delenv(NATIVE_LIB, raising=False)
    nativelib._forget()
    yield
    nativelib._forget()


def stand_in(folder, abi, name):
    """A tiny shared library exporting ``dp_abi_version() -> abi`` (C: the smallest build there is), or None
    without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, out = folder / f"{name}.c", folder / f"lib{name}.so"
    src.write_text(f"unsigned int dp_abi_version(void) {{ return {abi}u; }}\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True, timeout=60)
    return out


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nativelib")
    same, other = stand_in(folder, nativelib.ABI, "same"), stand_in(folder, nativelib.ABI + 41, "other")
    if same is None:
        pytest.skip("no C compiler to build the stand-in libraries")
    return same, other


def test_the_install_built_it_where_cargo_is_installed():
    if nativelib.load() is not None:
        assert nativelib.why_not() is None and nativelib.path() in nativelib.candidates()
        assert nativelib.load().dp_abi_version() == nativelib.ABI
        return
    if shutil.which("cargo") is None:
        pytest.skip(f"no cargo and no library: the Python path reads every trace ({nativelib.why_not()})")
    target = nativelib.candidates()[0]
    pytest.fail(f"cargo is on PATH but the native decoder does not load: {nativelib.why_not()}. Build it with the "
                f"install (pip install -e . in the checkout writes {target}), or copy the library that "
                f"cargo build --release --manifest-path native/Cargo.toml writes "
                f"(native/target/release/libdistprof_native.so) to {target}")


@pytest.mark.parametrize("value", ["0", "off", " False "])
def test_switched_off_by_the_environment(monkeypatch, stand_ins, value):
    monkeypatch.setenv(NATIVE_LIB, str(stand_ins[0]))
    monkeypatch.setenv(NATIVE, value)
    assert nativelib.load() is None
    assert nativelib.why_not() == f"switched off ({NATIVE}={value})"
    assert nativelib.status_line() == f"native decoder: not in use, switched off ({NATIVE}={value})"


def test_a_library_given_by_the_environment_loads_once_per_process(monkeypatch, stand_ins):
    monkeypatch.setenv(NATIVE, "1")
    monkeypatch.setenv(NATIVE_LIB, str(stand_ins[0]))
    calls = []
    real = nativelib._find
    monkeypatch.setattr(nativelib, "_find", lambda: calls.append(1) or real())
    lib = nativelib.load()
    assert isinstance(lib, ctypes.CDLL) and nativelib.why_not() is None and nativelib.path() == stand_ins[0]
    assert nativelib.load() is lib and calls == [1]
    assert nativelib.status_line() == f"native decoder: in use ({stand_ins[0]})"


def test_a_library_of_another_abi_is_refused(monkeypatch, stand_ins):
    monkeypatch.setenv(NATIVE_LIB, str(stand_ins[1]))
    assert nativelib.load() is None
    why = nativelib.why_not()
    assert f"speaks ABI {nativelib.ABI + 41}, this distprof speaks {nativelib.ABI}" in why and "reinstall" in why
    assert "\n" not in why


def test_not_built_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(nativelib, "candidates", lambda: [tmp_path / "_native.so"])
    assert nativelib.load() is None and nativelib.path() is None
    assert nativelib.why_not() == ("not built: install a Rust toolchain (cargo) and reinstall distprof "
                                   "(README: The native decoder)")
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert f"## {nativelib.README_SECTION}\n" in readme


@pytest.mark.parametrize("what", ["missing", "text", "empty", "folder", "libc"])
def test_what_is_not_the_library_is_one_line_never_a_traceback(monkeypatch, tmp_path, what):
    target = {"missing": tmp_path / "nope.so", "text": tmp_path / "text.so", "empty": tmp_path / "empty.so",
              "folder": tmp_path, "libc": None}[what]
    if what == "text":
        target.write_text("not a library\n" * 100)
    elif what == "empty":
        target.write_bytes(b"")
    elif what == "libc":
        found = [p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib/libc.so.6")
                 if os.path.isfile(p)]
        if not found:
            pytest.skip("no libc at a known path")
        target = found[0]
    monkeypatch.setenv(NATIVE_LIB, str(target))
    assert nativelib.load() is None
    why = nativelib.why_not()
    assert why and "\n" not in why and len(why) < 600
    expect = {"missing": "no such file", "folder": "not a file", "libc": "no dp_abi_version"}.get(what,
                                                                                                   "does not load")
    assert expect in why, why


def test_the_variables_are_no_config_settings():
    """DISTPROF_NATIVE=0 in a worker's environment must not make its ProfilerConfig refuse an unknown setting."""
    from distprof.config.model import env_overrides

    assert {NATIVE, NATIVE_LIB} <= NOT_SETTINGS
    assert env_overrides({}, {NATIVE: "0", NATIVE_LIB: "/x.so"}) == {}


def test_the_package_builds_it_where_nativelib_looks():
    """pyproject's setuptools-rust entry puts the library where :func:`nativelib.candidates` looks, optional (an
    install without cargo goes on), release, never on the network; git ignores the built file."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert any(r.startswith("setuptools-rust") for r in project["build-system"]["requires"])
    (ext,) = project["tool"]["setuptools-rust"]["ext-modules"]
    assert ext["target"] == f"distprof.{nativelib.STEM}" and ext["binding"] == "NoBinding"
    assert ext["optional"] is True and ext["debug"] is False
    assert {"--offline", "--locked"} <= set(ext["cargo-manifest-args"])
    assert os.path.isfile(os.path.join(REPO, ext["path"]))
    assert os.path.isfile(os.path.join(REPO, "native", "Cargo.lock"))
    if shutil.which("git") and os.path.exists(os.path.join(REPO, ".git")):  # a checkout (a worktree's .git is a file)
        name = f"src/distprof/{nativelib.candidates()[0].name}"
        proc = subprocess.run(["git", "check-ignore", "-q", name], cwd=REPO, capture_output=True, timeout=60)
        assert proc.returncode == 0, f"git does not ignore {name}"

