"""The ``engine`` setting: which rollout engine's own profiler a role drives, and how (see capture/engines/capture.py).

    per_role: {rollout: {engine: {kind: sglang, url: "http://127.0.0.1:30000", flush_timeout_s: 120}}}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

__all__ = ["EngineConfig"]


class EngineConfig(BaseModel):
    """A rollout engine whose profiler is started and stopped at the planned global steps."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: Literal["vllm", "sglang"]
    """The engine: ``vllm`` (0.13+) or ``sglang`` (see capture/engines/contract.py for the API each follows)."""
    url: str | None = None
    """The engine server's base URL (``http://127.0.0.1:30000``); None when the engine is attached in process
    (``distprof.capture.engines.attach``)."""
    trace_dir: str | None = None
    """Where the engine writes its traces, on this host. vLLM: its ``--profiler-config`` ``torch_profiler_dir``
    (required: the server chooses it). SGLang: sent as ``output_dir``; default a fresh temporary folder."""
    flush_timeout_s: float = 120.0
    """Seconds to wait for the engine to stop and write its traces (off the training thread); after that the
    window is recorded ``complete: false`` and training never waits longer. vLLM's docs give about 10 minutes
    for 100 requests on a 70B model."""
    request_timeout_s: float = 10.0
    """Seconds the version query, and a start that holds training, may take (with ``iterations`` the start is
    sent at the window's first step, before that step runs). A start sent ahead of a whole window, off the
    training thread, may take up to ``flush_timeout_s``."""
    iterations: int | None = None
    """Profile only the first N engine iterations of each window (SGLang ``num_steps``); None = all of the
    window's generation. For vLLM set ``max_iterations`` in the server's ``--profiler-config`` instead."""
    profile_by_stage: bool = False
    """SGLang: separate prefill and decode traces (needs ``iterations``)."""
    activities: list[str] | None = None
    """SGLang: ``CPU``, ``GPU``, ``MEM``, ``RPD``; None = the engine's default (CPU and GPU)."""
    with_stack: bool | None = None
    """SGLang: record Python stacks; None = the engine's default."""
    record_shapes: bool | None = None
    """SGLang: record input shapes; None = the engine's default."""
    version: str | None = None
    """The engine's version, recorded in each manifest line when the engine does not say (its version route)."""

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, str) or not v.startswith(("http://", "https://")) or len(v) > 2048:
            raise ValueError(f"engine.url must be an http(s) URL, got {str(v)[:80]!r}; e.g. url: "
                             "\"http://127.0.0.1:30000\"")
        return v.rstrip("/")

    @field_validator("flush_timeout_s", "request_timeout_s", mode="before")
    @classmethod
    def _timeout(cls, v: Any, info) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 86400):
            raise ValueError(f"engine.{info.field_name} must be a number of seconds in (0, 86400], got {v!r}; "
                             f"e.g. {info.field_name}: 120")
        return float(v)

    @field_validator("iterations", mode="before")
    @classmethod
    def _iterations(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"engine.iterations must be an integer >= 1 or null, got {v!r}; use null for all of a "
                             "step's generation")
        return v

    @field_validator("activities", mode="before")
    @classmethod
    def _activities(cls, v: Any) -> Any:
        ok = ("CPU", "GPU", "MEM", "RPD", "CUDA_PROFILER")
        if v is not None and (not isinstance(v, list) or not v or any(a not in ok for a in v)):
            raise ValueError(f"engine.activities must be a non-empty list of {', '.join(ok)}, got {v!r}; e.g. "
                             "activities: [CPU, GPU]")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> EngineConfig:
        if self.kind == "vllm" and self.iterations is not None:
            raise ValueError(f"engine.iterations is {self.iterations}, but vLLM takes its iteration limit from the "
                             "server (--profiler-config '{\"max_iterations\": N}'); set it there and leave "
                             "iterations null")
        if self.kind == "vllm" and self.url is not None and not self.trace_dir:
            raise ValueError("engine.trace_dir is null, but a vLLM server writes where its --profiler-config "
                             "torch_profiler_dir says; set trace_dir to that folder")
        if self.profile_by_stage and self.iterations is None:
            raise ValueError("engine.profile_by_stage is true but iterations is null; SGLang profiles by stage only "
                             "for a number of steps: set iterations (e.g. 5)")
        if self.kind == "vllm" and (self.profile_by_stage or self.activities or self.with_stack is not None
                                    or self.record_shapes is not None):
            raise ValueError("engine: profile_by_stage, activities, with_stack and record_shapes are SGLang request "
                             "fields; for vLLM set them in the server's --profiler-config")
        return self
