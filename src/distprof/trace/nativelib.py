"""Provisional loader (the build helper's nativelib replaces it): DISTPROF_NATIVE_LIB or native/target."""

from __future__ import annotations

import ctypes
import os
from typing import Any

from distprof.util.envvars import NATIVE, NATIVE_LIB

ABI = 1
_lib: Any = None


def load() -> Any:
    global _lib
    if _lib is None:
        path = os.environ.get(NATIVE_LIB, "")
        if os.environ.get(NATIVE) == "0" or not os.path.isfile(path):
            _lib = False
        else:
            lib = ctypes.CDLL(path)
            _lib = lib if lib.dp_abi_version() == ABI else False
    return _lib or None
