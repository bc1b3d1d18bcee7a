"""Communication / computation overlap: how much of the time a rank communicates it also computes.

``share`` = (time a collective and a compute run at once) / (time a collective runs), on the device
(the rank's collectives against compute kernels; HolisticTraceAnalysis's ``get_comm_comp_overlap``) and
on the host (c10d / gloo ranges against CPU ops, for CPU-only jobs, where gloo runs on its own threads).
The collectives are where :func:`.vocab.collective_source` says they run: collective kernels, or on a GPU
rank without any (gloo with CUDA tensors) its host-side collectives, within its device span, against the
compute kernels that run meanwhile. Per rank over the whole selection, and per step. A rank that does
not communicate has no figure.

A collective kernel also runs while it waits for late peers (it spins), so a low share on a rank that
``stragglers`` shows waiting is the wait, not a lack of overlap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from distprof.analysis.records import CommOverlap, Overlap, Ranked
from distprof.trace.ranks import summed
from distprof.trace.table import Sets, TraceTable
from distprof.util import intervals as iv

__all__ = ["combine", "extract", "figures", "step_figure"]


def _one(comm: iv.IntervalSet, compute: iv.IntervalSet) -> dict[str, float] | None:
    total = iv.length(comm)
    if total <= 0:
        return None
    both = iv.length(iv.intersect(comm, compute))
    return {"communication_us": total, "overlapped_us": both, "share": both / total}


def figures(s: Sets) -> dict[str, Any]:
    t = s.host_span
    # Host overlap only means something where collectives run on their own threads (gloo on CPU-only
    # jobs); on a GPU job every host-side collective call sits inside the op that issued it.
    host = _one(iv.intersect(s.host_comm, t), iv.intersect(s.host_compute, t)) \
        if t[0].size and not s.device_span[0].size else None
    return {"device": _one(iv.intersect(s.collectives, s.device_span), s.compute), "host": host}


def extract(tb: TraceTable) -> dict[str, Any]:
    steps = {int(num): figures(tb.sets(i)) for i, num in enumerate(tb.steps[:, 2].tolist())
             if len(tb.step_index().get(i, ()))}
    return {**figures(tb.sets()), "steps": steps}


def _share(fig: dict[str, float] | None) -> CommOverlap | None:
    if fig is None:
        return None
    return CommOverlap(communication_us=fig["communication_us"], overlapped_us=fig["overlapped_us"],
                       share=fig["overlapped_us"] / fig["communication_us"] if fig["communication_us"] else 0.0)


def combine(files: Iterable[tuple[Any, dict[str, Any]]]) -> list[Ranked[Overlap]]:
    """Per rank (its files summed): device and host overlap."""
    return [Ranked(info.role, info.rank, info.path, Overlap(device=_share(s["device"]), host=_share(s["host"])))
            for info, s in summed(files, ("device", "host"))]


def step_figure(part: dict[str, Any], step: int) -> Overlap | None:
    """One rank's figure for one step, None for a step its file does not have."""
    fig = part.get("steps", {}).get(step)
    return None if fig is None else Overlap(device=_plain(fig["device"]), host=_plain(fig["host"]))


def _plain(fig: dict[str, float] | None) -> CommOverlap | None:
    return None if fig is None else CommOverlap(**fig)
