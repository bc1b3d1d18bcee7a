"""SGLang: ``POST /start_profile`` with ``output_dir`` (a folder of its own per window), ``num_steps`` and the
recording options; ``POST /stop_profile``. In process: the same fields as keywords of ``start_profile``."""

from __future__ import annotations

import os
from typing import Any

from distprof.capture.engines.base import EngineAdapter

__all__ = ["SglangAdapter"]


class SglangAdapter(EngineAdapter):
    kind = "sglang"

    def out_dir_for(self, window: tuple[int, int], default_root: str) -> str:
        root = self.config.trace_dir or default_root
        return os.path.join(root, f"sglang-r{self.replica}-p{os.getpid()}-step{window[0]:08d}-{window[1]:08d}")

    def _start_body(self, out_dir: str) -> dict[str, Any]:
        c = self.config
        body: dict[str, Any] = {"output_dir": out_dir}
        for key, value in (("num_steps", c.iterations), ("activities", c.activities), ("with_stack", c.with_stack),
                           ("record_shapes", c.record_shapes)):
            if value is not None:
                body[key] = value
        if c.profile_by_stage:
            body["profile_by_stage"] = True
        return body

    def _start_kwargs(self, out_dir: str) -> dict[str, Any]:
        return self._start_body(out_dir)
