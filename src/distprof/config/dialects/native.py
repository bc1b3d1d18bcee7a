"""A distprof config itself, checked the way a dialect is: every bad field reported at once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distprof.config.dialects.translation import Builder


def looks_like(data: Any) -> bool:
    return False


def translate(b: Builder) -> None:
    data = b.data
    if isinstance(data, Mapping) and "enable" not in data:
        # As ProfilerConfig.from_yaml: a file may hold the settings under a top-level distprof: or profiler: key.
        for key in ("distprof", "profiler"):
            if isinstance(data.get(key), Mapping):
                b.data = data = data[key]
                break
    if not isinstance(data, Mapping):
        b.error("config", data,
                "expected a mapping of distprof settings (enable, backend, save_path, ranks, steps ...)")
        return
    for key, value in data.items():
        b.set(str(key), value, str(key))
