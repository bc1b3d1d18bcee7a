"""A stand-in for ``torch.cuda.memory._snapshot()``: builds and writes allocator snapshots in exactly torch's format,
so the memory answers are tested without a GPU. The ONE place tests build snapshots.

The contract is torch's own, and nothing else defines it:

- ``torch/cuda/memory.py``, ``_snapshot``'s docstring (torch 2.13: the ``Snapshot``, ``Segment``, ``Block``,
  ``Frame`` and ``TraceEntry`` TypedDicts): ``segments`` (``device``, ``address``, ``total_size``,
  ``allocated_size``, ``active_size``, ``requested_size``, ``stream``, ``segment_type``, ``segment_pool_id``,
  ``blocks``: ``size``, ``requested_size``, ``address``, ``state``, ``frames``) and ``device_traces`` (per device, in
  time order: ``action`` alloc / free_requested / free_completed / segment_alloc / segment_free / segment_map /
  segment_unmap / oom / snapshot, ``addr`` (``device_free`` instead for an oom), ``size``, ``stream``, ``time_us``,
  ``frames``);
- ``torch/csrc/cuda/memory_snapshot.cpp`` (pytorch/pytorch, ``_memory_snapshot_pickled``): the keys as written,
  ``allocator_settings``, frames ``{"filename", "line", "name"}`` shared between entries (one object per distinct
  stack, so the pickle memoizes them), a block's state ``active_pending_free``;
- ``torch/csrc/cuda/Module.cpp`` (``_cuda_memorySnapshot``, torch >= 2.5): ``external_annotations``, one dict per
  ``record_function`` range edge while history is recorded: ``{"device", "time_us", "stage": "START" | "END",
  "name"}``.

distprof's backend (``capture/backends/cuda_memory.py``) pickles the dict with protocol 4.
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["Builder", "frame", "write"]


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


class Builder:
    """One device's allocator history, event by event (times in µs, increasing), and the state it leaves."""

    def __init__(self, device: int = 0, t0: int = 1_000_000) -> None:
        self.device = device
        self.t = t0
        self.trace: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []
        self.live: dict[int, tuple[int, list]] = {}  # addr -> (size, frames) of allocated blocks
        self.reserved = 0
        self._next = 0x7F0000000000

    def _tick(self, dt: int) -> int:
        self.t += dt
        return self.t

    def segment(self, size: int, dt: int = 1) -> None:
        self.trace.append({"action": "segment_alloc", "addr": self._next + (1 << 40), "size": size, "stream": 0,
                           "time_us": self._tick(dt), "frames": []})
        self.reserved += size

    def alloc(self, size: int, frames: list | None = None, dt: int = 1) -> int:
        addr = self._next
        self._next += max(size, 512)
        frames = frames if frames is not None else []
        self.trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": self._tick(dt),
                           "frames": frames})
        self.live[addr] = (size, frames)
        return addr

    def free(self, addr: int, dt: int = 1) -> None:
        size, frames = self.live.pop(addr)
        for action in ("free_requested", "free_completed"):
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": self._tick(dt), "frames": frames})

    def oom(self, size: int, device_free: int, frames: list | None = None, dt: int = 1) -> None:
        self.trace.append({"action": "oom", "device_free": device_free, "size": size, "stream": 0,
                           "time_us": self._tick(dt), "frames": frames or []})

    def annotate(self, name: str, stage: str, dt: int = 1) -> None:
        self.annotations.append({"device": self.device, "time_us": self._tick(dt), "stage": stage, "name": name})

    def snapshot(self, annotations: bool = True, before: dict[int, int] | None = None) -> dict[str, Any]:
        """The snapshot dict (``before``: addr -> size of blocks allocated before the history began, still live)."""
        blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": f}
                  for a, (s, f) in sorted(self.live.items())]
        blocks += [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": []}
                   for a, s in sorted((before or {}).items())]
        used = sum(b["size"] for b in blocks)
        total = max(self.reserved + sum((before or {}).values()), used)
        seg = {"device": self.device, "address": 0x7F0000000000, "total_size": total, "allocated_size": used,
               "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
        if total > used:
            seg["blocks"].append({"address": 0, "size": total - used, "requested_size": 0, "state": "inactive",
                                  "frames": []})
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.device)] + [self.trace]
        out: dict[str, Any] = {"segments": [seg], "device_traces": traces,
                               "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                                      "garbage_collection_threshold": 0.0,
                                                      "expandable_segments": False}}
        if annotations:
            out["external_annotations"] = list(self.annotations)
        return out


def write(path: str, snapshot: dict[str, Any]) -> str:
    """Pickle ``snapshot`` as distprof's backend does (protocol 4); returns ``path``."""
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    return path
