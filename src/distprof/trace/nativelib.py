"""Finds and loads the native decoder's library (the crate in ``native/``, built by the install where cargo is
installed; README: "The native decoder") with ctypes, once per process.

Where it looks: ``DISTPROF_NATIVE_LIB`` when set (that file and no other: tests and benchmarks build the crate into
a temporary folder), else ``distprof/_native<suffix>`` beside the package, where both the wheel and the editable
install put it (``<suffix>`` one of the interpreter's extension suffixes, e.g. ``.cpython-311-x86_64-linux-gnu.so``;
the library has no Python binding, only a C ABI). ``DISTPROF_NATIVE=0`` switches it off.

:func:`load` gives the :class:`ctypes.CDLL` or None, :func:`why_not` the one line saying why it is None. This module
checks the library's ``dp_abi_version()`` against :data:`ABI` and declares nothing else: the scanner's functions
are declared by :mod:`distprof.trace.native` on the CDLL it gets here.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
import threading
from pathlib import Path

from distprof.util.envvars import NATIVE, NATIVE_LIB

__all__ = ["ABI", "README_SECTION", "candidates", "load", "path", "status_line", "why_not"]

log = logging.getLogger(__name__)

# The C ABI this distprof speaks; native/src/lib.rs's dp_abi_version() returns the one it was built with.
ABI = 4
README_SECTION = "The native decoder"
# Where the library lands in the package: pyproject.toml, [[tool.setuptools-rust.ext-modules]] target.
STEM = "_native"
_OFF = frozenset({"0", "false", "no", "off"})
_HOW = f"install a Rust toolchain (cargo) and reinstall distprof (README: {README_SECTION})"

_lock = threading.Lock()
_state: dict[str, object] = {}


def candidates() -> list[Path]:
    """The files the install may have built, in the order they are tried (the package's own folder)."""
    package = Path(__file__).resolve().parent.parent
    return [package / f"{STEM}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]


def _open(file: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """The library at ``file`` with its ABI checked, or None and the reason (never an exception)."""
    try:
        lib = ctypes.CDLL(str(file))
    except OSError as e:
        return None, f"{file} does not load: {' '.join(str(e).split())[:300]}"
    try:
        version = lib.dp_abi_version
    except AttributeError:
        return None, f"{file} is no distprof native decoder (it has no dp_abi_version)"
    version.argtypes, version.restype = [], ctypes.c_uint32
    found = int(version())
    if found != ABI:
        return None, (f"{file} speaks ABI {found}, this distprof speaks {ABI}: "
                      "reinstall distprof to rebuild it (pip install -e . in a checkout)")
    return lib, None


def _find() -> tuple[ctypes.CDLL | None, str | None, Path | None]:
    if os.environ.get(NATIVE, "").strip().lower() in _OFF:
        return None, f"switched off ({NATIVE}={os.environ[NATIVE]})", None
    chosen = os.environ.get(NATIVE_LIB)
    if chosen:
        file = Path(chosen).resolve()  # a bare name would make the loader search the system's folders
        if not file.is_file():
            return None, f"{NATIVE_LIB}={chosen}: {'not a file' if file.exists() else 'no such file'}", None
        return (*_open(file), file)
    for file in candidates():
        if file.is_file():
            return (*_open(file), file)
    return None, f"not built: {_HOW}", None


def _loaded() -> dict[str, object]:
    with _lock:
        if not _state:
            lib, reason, file = _find()
            _state.update(lib=lib, reason=reason, path=file)
            if lib is None:
                log.debug("native decoder not in use: %s", reason)
            else:
                log.debug("native decoder loaded from %s", file)
        return _state


def load() -> ctypes.CDLL | None:
    """The native decoder's library, loaded once per process; None when it is switched off, not built, of another
    ABI or does not load (:func:`why_not` says which)."""
    lib = _loaded()["lib"]
    return lib if isinstance(lib, ctypes.CDLL) else None


def why_not() -> str | None:
    """One line saying why :func:`load` is None (switched off, not built and how to build it, another ABI, the
    loader's error); None when the library is loaded."""
    reason = _loaded()["reason"]
    return reason if isinstance(reason, str) else None


def path() -> Path | None:
    """The file :func:`load` loaded (or tried to load); None when switched off or not built."""
    file = _loaded()["path"]
    return file if isinstance(file, Path) else None


def status_line() -> str:
    """What ``distprof --version`` prints about the native decoder: in use (and from where), or why not."""
    if load() is not None:
        return f"native decoder: in use ({path()})"
    return f"native decoder: not in use, {why_not()}"


def _forget() -> None:
    """Tests only: load again on the next call (after changing the environment)."""
    with _lock:
        _state.clear()
