"""The event vocabulary every analysis shares: what kind of work an event is, which step it marks,
whether it is communication, what kind of thread runs it.

One module, imported by every analysis, so a category, a kernel family or the ``ProfilerStep#`` rule
is spelled exactly once. Categories are Kineto's (``libkineto/src/ActivityType.cpp``) plus the
2021-schema spellings (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``) that old traces
and the TensorBoard plugin's samples use.
"""

from __future__ import annotations

import functools
import re

__all__ = [
    "DEVICE_CATEGORY_NAMES",
    "DEVICE_KINDS",
    "ENGINE_SUFFIX",
    "HOST_KINDS",
    "KIND_OF_CATEGORY",
    "ON_DEVICE",
    "ON_HOST",
    "SHAPED_OPS",
    "STEP_PREFIX",
    "Kind",
    "ThreadKind",
    "collective_kind",
    "collective_name",
    "collective_source",
    "engine_parent",
    "engine_stage",
    "is_collective_op",
    "is_comm_host_event",
    "is_comm_kernel",
    "is_dataloader",
    "is_engine_iteration",
    "is_engine_role",
    "is_sync",
    "is_sync_op",
    "is_sync_runtime",
    "kind_of",
    "looks_like_device",
    "memcpy_endpoints",
    "profiler_step",
    "thread_kind",
]


class Kind:
    """Integer codes of event kinds (small ints: they are stored in int8 columns)."""
    OTHER = 0  # known but not analysed (flows, Trace spans, overhead, instant events ...)
    KERNEL = 1  # device compute or communication kernel
    MEMCPY = 2
    MEMSET = 3
    CPU_OP = 4  # aten / c10d / user ops on a CPU thread
    ANNOTATION = 5  # user_annotation: record_function / distprof.annotate ranges (phases)
    GPU_ANNOTATION = 6  # the device-side projection of an annotation (not device work)
    RUNTIME = 7  # host-side runtime / driver API calls (cudaLaunchKernel, hipMemcpyAsync ...)
    PYTHON = 8  # python_function (with_stack)
    STEP = 9  # torch's ProfilerStep#N range
    DEVICE_SYNC = 10  # device-side synchronisation events (``cuda_sync``: stream/event waits)
    UNKNOWN = 11  # a category this module does not know

    NAMES = ("other", "kernel", "memcpy", "memset", "cpu_op", "annotation", "gpu_annotation", "runtime",
             "python", "step", "device_sync", "unknown")


DEVICE_KINDS = frozenset({Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET})
HOST_KINDS = frozenset({Kind.CPU_OP, Kind.ANNOTATION, Kind.RUNTIME, Kind.PYTHON, Kind.STEP})

KIND_OF_CATEGORY: dict[str, int] = {
    # device work
    "kernel": Kind.KERNEL, "Kernel": Kind.KERNEL,
    "mtia_ccp_events": Kind.KERNEL,  # MTIA device events (HTA reads these as the MTIA kernel stream)
    "gpu_memcpy": Kind.MEMCPY, "Memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET, "Memset": Kind.MEMSET,
    "cuda_sync": Kind.DEVICE_SYNC,
    # host work
    "cpu_op": Kind.CPU_OP, "Operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_runtime": Kind.RUNTIME, "Runtime": Kind.RUNTIME, "cuda_driver": Kind.RUNTIME,
    "xpu_runtime": Kind.RUNTIME, "xpu_driver": Kind.RUNTIME, "mtia_runtime": Kind.RUNTIME,
    "privateuse1_runtime": Kind.RUNTIME, "privateuse1_driver": Kind.RUNTIME, "glow_runtime": Kind.RUNTIME,
    "hip_runtime": Kind.RUNTIME,
    "python_function": Kind.PYTHON,
    # known, not analysed
    "Trace": Kind.OTHER, "fwdbwd": Kind.OTHER, "ac2g": Kind.OTHER, "async_cpu_to_gpu": Kind.OTHER,
    "cpu_instant_event": Kind.OTHER, "overhead": Kind.OTHER, "external_correlation": Kind.OTHER,
    "cuda_profiler_range": Kind.OTHER, "async": Kind.OTHER, "Python": Kind.PYTHON, "mtia_insight": Kind.OTHER,
    "gpu_pm_counter": Kind.OTHER, "collective_comm": Kind.OTHER, "": Kind.OTHER,
}

# Words that make an unknown category look like device work (warned about once, never counted).
_DEVICE_WORDS = re.compile(r"gpu|kernel|device|mtia|xpu|hpu|npu|tpu|memcpy|memset|cuda|hip|rocm|accel", re.I)

DEVICE_CATEGORY_NAMES = sorted(c for c, k in KIND_OF_CATEGORY.items() if k in DEVICE_KINDS)


def kind_of(category: str) -> int:
    return KIND_OF_CATEGORY.get(category, Kind.UNKNOWN)


def looks_like_device(category: str) -> bool:
    """An unknown category whose name suggests device work (the user is told it was not counted)."""
    return bool(_DEVICE_WORDS.search(category))


# ---- ops whose input shapes the reader keeps (FLOPs and bytes from shapes) -----------------------------
# The names of :data:`distprof.analysis.flops.TABLE` (a test keeps the two equal): the reader decodes ``Input Dims``,
# ``Input type``, ``Concrete Inputs`` and ``Sequence number`` of these CPU ops only, and only while the trace has
# shapes (``record_shapes``).
_MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm")
_CONV_OPS = ("convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose", "conv1d", "conv2d",
             "conv3d", "convolution_backward")
_ATTENTION_OPS = (
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
    "_efficient_attention_forward", "_cudnn_attention_forward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_flash_attention_backward",
    "_efficient_attention_backward", "_cudnn_attention_backward")
_MEMORY_OPS = (
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "exp", "log", "sqrt", "rsqrt", "pow", "tanh",
    "tanh_backward", "sigmoid", "sigmoid_backward", "relu", "relu_", "threshold_backward", "gelu", "gelu_backward",
    "silu", "silu_backward", "where", "masked_fill", "copy_", "native_layer_norm", "native_layer_norm_backward",
    "layer_norm", "_fused_rms_norm", "rms_norm", "native_batch_norm", "_softmax", "_softmax_backward_data",
    "_log_softmax", "_log_softmax_backward_data", "native_dropout", "native_dropout_backward", "embedding",
    "sum", "mean")
SHAPED_OPS = frozenset("aten::" + n for n in _MATMUL_OPS + _CONV_OPS + _ATTENTION_OPS + _MEMORY_OPS)


# ---- steps ---------------------------------------------------------------------------------------------
STEP_PREFIX = "ProfilerStep#"
_STEP = re.compile(r"ProfilerStep#([0-9]{1,18})")  # ASCII digits only: '²'.isdigit() is True, int('²') fails


def profiler_step(name: str) -> int | None:
    """N for torch's ``ProfilerStep#N`` (a global step under distprof), else None."""
    if not name.startswith(STEP_PREFIX):
        return None
    m = _STEP.fullmatch(name)
    return int(m.group(1)) if m else None


# ---- communication -------------------------------------------------------------------------------------
# Device kernels that are collectives, by family (not by words such as "broadcast", which elementwise
# kernels use too): NCCL's old and new kernel names (RCCL keeps NCCL's names: ncclDevKernel_Generic),
# HCCL, torch's symmetric-memory collectives, and the custom all-reduce of vLLM / SGLang.
_COMM_KERNEL = re.compile(
    r"^(?:void\s+)?(?:nccl|rccl|hccl)"  # ncclKernel_*, ncclDevKernel_*, rcclGenericKernel ...
    r"|ncclKernel|ncclDevKernel"
    r"|c10d::symmetric_memory::"  # torch symm_mem: one_shot_all_reduce_kernel, multimem_all_reduce_kernel ...
    r"|(?:^|\s|::)multimem_(?:all_reduce|all_gather|reduce_scatter|one_shot|two_shot)"
    r"|(?:^|\s|::)cross_device_reduce_(?:1|2)stage",
)


@functools.lru_cache(maxsize=1 << 16)  # each file of a run names the same kernels; the search scans all of a long name
def is_comm_kernel(name: str) -> bool:
    """A device kernel that is a collective, judged by its name (metadata is checked by the caller)."""
    return bool(_COMM_KERNEL.search(name))


_COMM_HOST_PREFIXES = ("nccl:", "gloo:", "rccl:", "hccl:", "mpi:", "ucc:")


def collective_name(name: str) -> str:
    """A collective's name without its backend's prefix: the Flight Recorder's ``gloo:all_reduce`` /
    ``nccl:all_reduce`` is ``all_reduce``, as ``torch.distributed`` calls it."""
    return name.split(":", 1)[1] if name.startswith(_COMM_HOST_PREFIXES) else name


def is_comm_host_event(name: str) -> bool:
    """A host-side range that is communication: ``nccl:all_reduce`` / ``gloo:all_reduce`` annotations
    (gloo's run through its own threads), c10d collectives, and ``record_param_comms``."""
    return name.startswith(_COMM_HOST_PREFIXES) or is_collective_op(name) or name == "record_param_comms"


# Where a rank's collectives run: the one rule every analysis uses for "communication" (``stragglers``' arrivals,
# ``temporal``'s and ``overlap``'s device figures, ``idle``'s causes, ``diagnose``).
ON_DEVICE = "device"
ON_HOST = "host"


def collective_source(comm_kernels: bool) -> str:
    """Where a rank's collectives are measured: :data:`ON_DEVICE` when its trace has collective kernels (NCCL,
    RCCL, HCCL ...: the kernel is the collective, and spins while it waits for late peers), else
    :data:`ON_HOST`: its host-side collectives (:func:`is_comm_host_event`: c10d ops, ``gloo:``/``nccl:``
    ranges). gloo runs on the host whatever the tensors: with CUDA tensors it copies them to host memory,
    reduces there and copies back, so the device runs no collective kernel and sits idle (or computes)
    while the collective runs. A rank with collective kernels also has host-side c10d calls: they launch
    the kernels and are not counted a second time."""
    return ON_DEVICE if comm_kernels else ON_HOST


_C10D_NOT_COLLECTIVE = ("c10d::wait", "c10d::_wait", "c10d::monitored_barrier")


def is_collective_op(name: str) -> bool:
    """A c10d op that starts a collective on the calling rank (``c10d::allreduce_``, ``c10d::broadcast_`` ...)."""
    return name.startswith("c10d::") and not name.startswith(_C10D_NOT_COLLECTIVE)


_KIND = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)|c10d::_?([a-z_]+?)_*$|(?:nccl|rccl|gloo):([a-z_]+)", re.I)


def collective_kind(name: str, recorded: str | None = None) -> str:
    """A short, comparable kind: ``allreduce``, ``alltoallbase``, ``sendrecv`` ... (recorded metadata wins)."""
    if recorded:
        return recorded.lower().replace("_", "")
    m = _KIND.search(name)
    if not m:
        return name.split("(")[0]
    return next(g for g in m.groups() if g).lower().replace("_", "")


# ---- host-device synchronisation and data loading ------------------------------------------------------
# Not cudaStreamWaitEvent / hipStreamWaitEvent: they make one stream wait for another on the device and
# return at once; the host does not wait.
_SYNC_RUNTIME = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
})


def is_sync_runtime(name: str) -> bool:
    """A runtime call that blocks the host until the device catches up."""
    return name in _SYNC_RUNTIME


# ``.item()``, ``.tolist()``, ``bool(t)``, ``if t:`` on a device tensor all reach ``aten::_local_scalar_dense``,
# which copies the value to the host and waits for the device; ``aten::item`` is its usual caller.
_SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})


def is_sync_op(name: str) -> bool:
    """A CPU op that blocks the host until the device has computed a value it reads."""
    return name in _SYNC_OPS


def is_sync(name: str) -> bool:
    """A runtime call or CPU op during which the host waits for the device (:func:`is_sync_runtime`,
    :func:`is_sync_op`)."""
    return name in _SYNC_RUNTIME or name in _SYNC_OPS


_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")


def memcpy_endpoints(name: str) -> tuple[str, str, str] | None:
    """``("HtoD", "Pageable", "Device")`` for Kineto's ``Memcpy HtoD (Pageable -> Device)``; None for other names.
    A ``Pageable`` end is host memory that is not pinned: the copy is staged and blocks the host."""
    m = _MEMCPY.match(name)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def is_dataloader(name: str) -> bool:
    """The TensorBoard plugin's rule: the DataLoader iterator's ``__next__`` (and DataPipes)."""
    return (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or \
        name.startswith("enumerate(DataPipe)#")


# ---- threads -------------------------------------------------------------------------------------------
class ThreadKind:
    MAIN = "main"  # the thread that runs the training step (holds ProfilerStep, or the process's own thread)
    AUTOGRAD = "autograd"  # pt_autograd_N: backward on devices other than the CPU
    COMMUNICATION = "communication"  # pt_gloo_runloop, NCCL/gloo helper threads
    OTHER = "other"
    ALL = ("main", "autograd", "communication", "other")


def thread_kind(thread_name: str | None) -> str | None:
    """The kind a thread's name tells (None when the name does not say: decided by what the thread runs)."""
    if not thread_name:
        return None
    low = thread_name.lower()
    if "gloo" in low or "nccl" in low or "c10d" in low:
        return ThreadKind.COMMUNICATION
    if "autograd" in low:
        return ThreadKind.AUTOGRAD
    return None


# ---- inference engines (rollout) ------------------------------------------------------------------------
ENGINE_SUFFIX = "/engine"  # an engine's traces are the role "<role>/engine" (e.g. rollout/engine: DESIGN.md)


def is_engine_role(role: str | None) -> bool:
    return role is not None and role.endswith(ENGINE_SUFFIX)


def engine_parent(role: str) -> str:
    """The role an engine serves: ``rollout/engine`` -> ``rollout``."""
    return role[: -len(ENGINE_SUFFIX)] if is_engine_role(role) else role


# One engine iteration (a scheduler step: one forward over the running batch). vLLM v1's GPU model runner wraps
# its forward in ``record_function("gpu_model_runner: forward")`` (vllm/v1/worker/gpu_model_runner.py); older
# vLLM and the stand-ins name the call ``execute_model``; ``engine/step`` is distprof's own spelling.
_ENGINE_ITERATION = re.compile(r"^(?:gpu_model_runner: forward|execute_model|engine/step|engine_step)\b")
# Prefill vs decode: SGLang names its stages EXTEND (prefill) and DECODE (ForwardMode; with profile_by_stage its
# files end in -EXTEND / -DECODE: python/sglang/srt/managers/scheduler_profiler_mixin.py); annotations that say
# prefill or decode count as that stage.
_PREFILL = re.compile(r"prefill|(?:^|[^a-z])extend(?:[^a-z]|$)", re.I)
_DECODE = re.compile(r"decode", re.I)


def is_engine_iteration(name: str) -> bool:
    return bool(_ENGINE_ITERATION.match(name))


def engine_stage(name: str) -> str | None:
    """``"prefill"``, ``"decode"`` or None: the stage an annotation's (or an SGLang stage file's) name says."""
    if _DECODE.search(name):
        return "decode"
    if _PREFILL.search(name):
        return "prefill"
    return None
