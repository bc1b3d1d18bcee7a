"""Each rollout engine's documented profiling API, in one place (the adapters and the stand-in engine read it).

Checked against the engines' source on 2026-11-27 (they need CUDA, so nothing here ran against a real engine):

**vLLM** (0.13 and later; ``--profiler-config``):
  - ``vllm/config/profiler.py`` (``ProfilerConfig``: ``profiler`` ``torch``/``cuda``, ``torch_profiler_dir`` (also
    ``s3://``/``gs://``), ``torch_profiler_with_stack`` (default True), ``torch_profiler_use_gzip`` (default True),
    ``delay_iterations``, ``max_iterations`` (0 = no limit), ``wait/warmup/active_iterations``),
  - ``vllm/entrypoints/serve/profile/api_router.py``: ``POST /start_profile`` and ``POST /stop_profile``, empty
    body, answered ``200`` with no body once every worker has started / stopped (stop waits for the export:
    vLLM's docs advise raising ``VLLM_RPC_TIMEOUT`` for big models); the routes exist only when a profiler is
    configured (404 otherwise),
  - ``vllm/v1/worker/gpu_worker.py``: each worker's ``TorchProfilerWrapper`` is named
    ``{instance_id}-rank-{rank}`` (``rank``: the worker's global rank, TP x PP within its DP replica) and
    ``vllm/profiler/wrapper.py`` exports through ``torch.profiler.tensorboard_trace_handler``, so a trace is
    ``{instance_id}-rank-{rank}.{time_ns}.pt.trace.json.gz`` in ``torch_profiler_dir``,
  - in process: ``LLM.start_profile()`` / ``LLM.stop_profile()`` (``vllm/entrypoints/llm.py``),
  - before 0.13: the ``VLLM_TORCH_PROFILER_DIR`` environment variable turned the same routes on.
  https://github.com/vllm-project/vllm/blob/main/vllm/config/profiler.py ,
  https://github.com/vllm-project/vllm/blob/main/vllm/profiler/wrapper.py

**SGLang** (0.5; ``SGLANG_TORCH_PROFILER_DIR``):
  - ``python/sglang/srt/entrypoints/http_server.py``: ``POST /start_profile`` with an optional JSON body
    (``ProfileReqInput`` in ``python/sglang/srt/managers/io_struct.py``: ``output_dir``, ``start_step``,
    ``num_steps``, ``activities`` (``CPU``, ``GPU``, ``MEM``, ``RPD``), ``profile_by_stage``, ``with_stack``,
    ``record_shapes``, ``merge_profiles``, ``profile_prefix``), answered ``200`` ``"Start profiling.\\n"``;
    ``POST /stop_profile`` answered ``200`` ``"Stop profiling. This will take some time.\\n"`` once the
    schedulers have exported; ``num_steps`` set means the engine stops by itself after that many forward steps,
  - ``python/sglang/srt/utils/profile_utils.py``: each scheduler writes
    ``[{profile_prefix}-]{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}][-EP-{ep}][-{stage}].trace.json.gz`` in
    ``output_dir`` (default ``SGLANG_TORCH_PROFILER_DIR``, else ``/tmp``); DP/PP/EP only when that size is > 1,
    ``-{stage}`` (``prefill``/``decode``) with ``profile_by_stage``; ``merged-{profile_id}.trace.json.gz`` with
    ``merge_profiles``,
  - prefill and decode servers (disaggregation) are profiled separately: one ``url`` each (two roles).
  https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/utils/profile_utils.py ,
  https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/managers/io_struct.py

Engine rank -> rank folder (``{role}/engine/rank{R:05d}``): vLLM's ``rank`` as is; SGLang's
``(pp * DP + dp) * TP + tp`` (the sizes are the largest index seen in the window's files plus one; EP ranks lie
inside the TP group, so EP is recorded, not counted). A second replica's ranks follow the first's:
``R = replica * ranks_per_replica + local``.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

__all__ = [
    "CONTRACTS",
    "SGLANG",
    "SGLANG_BODY_FIELDS",
    "VLLM",
    "EngineContract",
    "local_rank",
    "parse_ranks",
    "sglang_file_name",
    "vllm_file_name",
]


@dataclass(frozen=True)
class EngineContract:
    kind: str
    version: str
    """The engine version this contract follows."""
    start_path: str
    stop_path: str
    method: str
    dir_env: str
    """The environment variable naming the trace folder (older vLLM; SGLang's default output_dir)."""
    start_reply: bytes
    stop_reply: bytes
    version_path: str
    """A GET route whose JSON reply carries ``version``."""
    sources: tuple[str, ...] = field(default=())


VLLM = EngineContract(
    kind="vllm", version="0.13", start_path="/start_profile", stop_path="/stop_profile", method="POST",
    dir_env="VLLM_TORCH_PROFILER_DIR", start_reply=b"", stop_reply=b"", version_path="/version",
    sources=("https://github.com/vllm-project/vllm/blob/main/vllm/config/profiler.py",
             "https://github.com/vllm-project/vllm/blob/main/vllm/profiler/wrapper.py",
             "https://github.com/vllm-project/vllm/blob/main/vllm/v1/worker/gpu_worker.py"))
SGLANG = EngineContract(
    kind="sglang", version="0.5", start_path="/start_profile", stop_path="/stop_profile", method="POST",
    dir_env="SGLANG_TORCH_PROFILER_DIR", start_reply=b"Start profiling.\n",
    stop_reply=b"Stop profiling. This will take some time.\n", version_path="/get_server_info",
    sources=("https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/entrypoints/http_server.py",
             "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/managers/io_struct.py",
             "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/utils/profile_utils.py"))
CONTRACTS = {c.kind: c for c in (VLLM, SGLANG)}

SGLANG_BODY_FIELDS = ("output_dir", "start_step", "num_steps", "activities", "profile_by_stage", "with_stack",
                      "record_shapes", "merge_profiles", "profile_prefix")
"""The keys of SGLang's ``/start_profile`` body (``ProfileReqInput``)."""

# ASCII digits only (re.ASCII): "٣" is no rank. At most 6 digits: no rank folder far past any real engine's size.
_VLLM_FILE = re.compile(r"^(?P<id>.+)-rank-(?P<rank>\d{1,6})\.\d+\.pt\.trace\.json(?:\.gz)?$", re.ASCII)
_SGLANG_FILE = re.compile(r"-TP-(?P<tp>\d{1,6})(?:-DP-(?P<dp>\d{1,6}))?(?:-PP-(?P<pp>\d{1,6}))?"
                          r"(?:-EP-(?P<ep>\d{1,6}))?(?:-(?P<stage>prefill|decode))?\.trace\.json(?:\.gz)?$", re.ASCII)


def vllm_file_name(instance_id: str, rank: int, time_ns: int, gzip: bool = True) -> str:
    """The name vLLM's worker ``rank`` gives its trace (tensorboard_trace_handler's)."""
    return f"{instance_id}-rank-{rank}.{time_ns}.pt.trace.json{'.gz' if gzip else ''}"


def sglang_file_name(profile_id: str, tp: int, dp: int = 0, pp: int = 0, ep: int = 0, dp_size: int = 1,
                     pp_size: int = 1, ep_size: int = 1, prefix: str | None = None, stage: str | None = None) -> str:
    """The name an SGLang scheduler gives its trace (profile_utils._ProfilerTorch.stop)."""
    parts = [profile_id, f"TP-{tp}"]
    if dp_size > 1:
        parts.append(f"DP-{dp}")
    if pp_size > 1:
        parts.append(f"PP-{pp}")
    if ep_size > 1:
        parts.append(f"EP-{ep}")
    return (f"{prefix}-" if prefix else "") + "-".join(parts) + (f"-{stage}" if stage else "") + ".trace.json.gz"


def parse_ranks(kind: str, name: str) -> dict[str, int | str] | None:
    """The ranks an engine's trace file name carries: vLLM ``{"rank"}``, SGLang ``{"tp", "dp", "pp", "ep"}``
    (absent ones 0) and ``stage`` when profiled by stage; None for a name that is not one of its traces (the
    vLLM front end's own trace, SGLang's merged file, a memory snapshot, anything else)."""
    base = posixpath.basename(name.replace("\\", "/"))
    if kind == "vllm":
        m = _VLLM_FILE.match(base)
        return {"rank": int(m.group("rank"))} if m else None
    if kind == "sglang":
        m = _SGLANG_FILE.search(base)
        if not m or base.startswith("merged-"):
            return None
        out: dict[str, int | str] = {k: int(m.group(k) or 0) for k in ("tp", "dp", "pp", "ep")}
        if m.group("stage"):
            out["stage"] = m.group("stage")
        return out
    return None


def local_rank(kind: str, ranks: dict[str, int | str], sizes: dict[str, int]) -> int:
    """The rank index within one engine replica (see the module docstring); ``sizes``: {tp, dp, pp}."""
    if kind == "vllm":
        return int(ranks["rank"])
    tp, dp, pp = (int(ranks.get(k, 0)) for k in ("tp", "dp", "pp"))
    return (pp * max(1, sizes.get("dp", 1)) + dp) * max(1, sizes.get("tp", 1)) + tp
