"""vLLM (0.13+): ``POST /start_profile`` / ``/stop_profile`` on the server, or ``LLM.start_profile()`` /
``stop_profile()`` in process; traces land in the server's ``torch_profiler_dir`` (capture/engines/contract.py)."""

from __future__ import annotations

import os
import tempfile

from distprof.capture.engines.base import EngineAdapter

__all__ = ["VllmAdapter"]


class VllmAdapter(EngineAdapter):
    kind = "vllm"

    def out_dir_for(self, window: tuple[int, int], default_root: str) -> str:
        # The server chose the folder at launch; an in-process engine without trace_dir: its VLLM_TORCH_PROFILER_DIR.
        return self.config.trace_dir or os.environ.get(self.contract.dir_env) or tempfile.gettempdir()
