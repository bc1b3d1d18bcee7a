"""Peak dense throughput of an accelerator, by the device name a trace's ``deviceProperties`` gives and a dtype.

Values are the vendors' datasheet figures **without sparsity** (NVIDIA prints the 2:4-sparse figure, twice the dense
one, for tensor cores: the dense one is used here), in TFLOP/s, plus the peak memory bandwidth in TB/s (a roofline's
ridge). Dtypes: ``fp64``, ``fp32`` (the non-tensor-core figure: torch's default for fp32 matmuls,
``allow_tf32=False``), ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8``; a dtype the device has no figure for has no
peak (MFU is then not computed).

A device is matched by substring of its name, case and punctuation aside, most specific first ("H100 PCIe" before
"H100"). The user's own figure wins: ``distprof summary --peak-tflops N`` (``peak_tflops=`` of
:func:`distprof.analysis.analyze.summary_result`) applies N to every device and dtype.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["DEVICES", "Peak", "lookup", "normalise"]


@dataclass(frozen=True)
class Device:
    name: str  # the name distprof reports
    match: tuple[str, ...]  # substrings of the normalised deviceProperties name (any one)
    tflops: dict[str, float]
    tbps: float  # peak memory bandwidth, TB/s
    source: str


@dataclass(frozen=True)
class Peak:
    """The peak used for one figure: the device as distprof names it, TFLOP/s, TB/s, and whether the user gave it."""
    device: str
    tflops: float | None
    tbps: float | None
    user: bool = False


# Most specific first: the first whose substring is in the name wins.
DEVICES: tuple[Device, ...] = (
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 NVL column; tensor figures halved: the page lists sparse)
    Device("H100 NVL", ("h100 nvl",), {"fp64": 30, "fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5,
                                       "fp8": 1670.5, "int8": 1670.5}, 3.9,
           "https://www.nvidia.com/en-us/data-center/h100/"),
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe column of the datasheet)
    Device("H100 PCIe", ("h100 pcie",), {"fp64": 26, "fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756,
                                         "fp8": 1513, "int8": 1513}, 2.0,
           "https://www.nvidia.com/en-us/data-center/h100/"),
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 NVL column)
    Device("H200 NVL", ("h200 nvl",), {"fp64": 30, "fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5,
                                       "fp8": 1670.5, "int8": 1670.5}, 4.8,
           "https://www.nvidia.com/en-us/data-center/h200/"),
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM column: the H100 SXM's compute, 141 GB HBM3e)
    Device("H200 SXM", ("h200",), {"fp64": 34, "fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4,
                                   "fp8": 1978.9, "int8": 1978.9}, 4.8,
           "https://www.nvidia.com/en-us/data-center/h200/"),
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM column; "NVIDIA H100 80GB HBM3" is the SXM part)
    Device("H100 SXM", ("h100",), {"fp64": 34, "fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4,
                                   "fp8": 1978.9, "int8": 1978.9}, 3.35,
           "https://www.nvidia.com/en-us/data-center/h100/"),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    # (PCIe and SXM have the same compute; bandwidth: 80GB SXM 2.039, 80GB PCIe 1.935, 40GB 1.555 TB/s)
    Device("A100 80GB SXM", ("a100 sxm4 80gb", "a100 sxm 80gb"), {"fp64": 9.7, "fp32": 19.5, "tf32": 156,
                                                                  "bf16": 312, "fp16": 312, "int8": 624}, 2.039,
           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
           "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    Device("A100 80GB PCIe", ("a100 80gb pcie", "a100 pcie 80gb"), {"fp64": 9.7, "fp32": 19.5, "tf32": 156,
                                                                    "bf16": 312, "fp16": 312, "int8": 624}, 1.935,
           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
           "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    Device("A100 40GB", ("a100",), {"fp64": 9.7, "fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
           1.555, "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
           "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    # https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
    # (no bf16 on Volta; fp16 is the tensor-core figure)
    Device("V100S PCIe", ("v100s",), {"fp64": 8.2, "fp32": 16.4, "fp16": 130}, 1.134,
           "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Device("V100 PCIe", ("v100 pcie",), {"fp64": 7, "fp32": 14, "fp16": 112}, 0.9,
           "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Device("V100 SXM2", ("v100",), {"fp64": 7.8, "fp32": 15.7, "fp16": 125}, 0.9,
           "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    # https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (dense figures; fp32 is the matrix one)
    Device("MI300X", ("mi300x",), {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
                                   "fp8": 2614.9, "int8": 2614.9}, 5.3,
           "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"),
    # https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html (fp32 is the matrix figure). ROCm names
    # both parts "AMD Instinct MI250X/MI250": matched as the MI250 (the lower peak) unless the name says MI250X alone.
    Device("MI250", ("mi250x mi250", "mi250 "), {"fp64": 90.5, "fp32": 90.5, "bf16": 362.1, "fp16": 362.1,
                                                 "int8": 362.1}, 3.2768,
           "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html"),
    Device("MI250X", ("mi250x",), {"fp64": 95.7, "fp32": 95.7, "bf16": 383, "fp16": 383, "int8": 383}, 3.2768,
           "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"),
    Device("MI250", ("mi250",), {"fp64": 90.5, "fp32": 90.5, "bf16": 362.1, "fp16": 362.1, "int8": 362.1}, 3.2768,
           "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html"),
)


def normalise(name: str) -> str:
    """Lower case, punctuation as spaces, one space between words, one at the end (so "mi250 " ends a word)."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", name.lower()).split()) + " "


@functools.lru_cache(maxsize=256)
def _device(name: str) -> Device | None:
    """The table's device that ``name`` matches (the driver asks once per rank and step: cached)."""
    norm = normalise(name)
    return next((d for d in DEVICES if any(m in norm for m in d.match)), None)


def lookup(device: str | None, dtype: str | None, user_tflops: float | None = None) -> Peak | None:
    """The peak for ``dtype`` on ``device`` (a deviceProperties name); the user's figure when given; None when the
    device is not in the table (or not known)."""
    found = _device(device) if device else None
    if user_tflops is not None:
        return Peak(found.name if found else (device or "unknown"), float(user_tflops),
                    found.tbps if found else None, user=True)
    if found is None:
        return None
    return Peak(found.name, found.tflops.get(dtype or ""), found.tbps)
