"""The merged interval sets the analyses share: one trace's (or one step's) device, host and thread busy time.

Built from a :class:`~distprof.trace.table.TraceTable`'s columns by :meth:`Sets.of` and cached by the table
(``TraceTable.sets(step)``), so every analysis of one verb merges each set once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from distprof.trace.vocab import ON_DEVICE, Kind, ThreadKind, collective_source, is_dataloader
from distprof.util import intervals as iv

if TYPE_CHECKING:
    from distprof.trace.table import TraceTable

__all__ = ["Sets"]


@dataclass
class Sets:
    """Merged interval sets (see :mod:`distprof.util.intervals`) of one trace or one step of it.

    Device: ``compute`` (kernels that are not collectives), ``comm`` (collective kernels), ``memory``
    (memcpy and memset), ``device_span`` (first device start to last device end, as a set of one).
    Host: ``host_compute`` (CPU ops that are not communication, on every thread but communication
    threads), ``host_comm`` (c10d ops, record_param_comms, nccl:/gloo: ranges, on any thread),
    ``host_span`` (the selected steps' ranges with --steps/--steps-only, else the first to the last host
    event on any thread; for one step, its range), ``runtime``,
    ``dataloader``, ``host_other`` (other CPU ops and annotations).
    """
    compute: iv.IntervalSet
    comm: iv.IntervalSet
    memory: iv.IntervalSet
    memcpy: iv.IntervalSet
    memset: iv.IntervalSet
    device_span: iv.IntervalSet
    host_compute: iv.IntervalSet
    host_comm: iv.IntervalSet
    host_span: iv.IntervalSet
    runtime: iv.IntervalSet
    dataloader: iv.IntervalSet
    host_ops: iv.IntervalSet  # every CPU op, annotation (not steps) and python function: the TB plugin's "CpuOp"
    threads: dict[str, iv.IntervalSet]  # thread kind -> its CPU ops
    collectives: iv.IntervalSet  # comm, or host_comm on a rank without collective kernels (vocab.collective_source)

    @classmethod
    def of(cls, tb: TraceTable, step: int | None) -> Sets:
        n = tb.ts.size
        if step is None:
            sel = tb.scope
            lo, hi = -np.inf, np.inf
        else:
            sel = np.zeros(n, dtype=bool)
            sel[tb.step_index().get(step, np.empty(0, dtype=np.int64))] = True
            lo, hi = tb.steps[step, 0], tb.steps[step, 1]
        k = tb.kind
        ts, end = tb.ts, tb.end
        host_end = np.minimum(end, hi)  # host work is cut at its step's end; device work is not

        def dev(m):
            m = m & sel
            return iv.merge(ts[m], end[m])

        def host(m):
            m = m & sel
            return iv.merge(ts[m], host_end[m])

        kernel = k == Kind.KERNEL
        memcpy, memset = k == Kind.MEMCPY, k == Kind.MEMSET
        compute, comm = dev(kernel & ~tb.comm), dev(kernel & tb.comm)
        mcp, mst = dev(memcpy), dev(memset)
        devm = (kernel | memcpy | memset) & sel
        device_span = (np.array([ts[devm].min()]), np.array([end[devm].max()])) if devm.any() else iv.empty()
        tk = tb.thread_kind_of_event()
        comm_thread = tk == ThreadKind.ALL.index(ThreadKind.COMMUNICATION)
        op = k == Kind.CPU_OP
        ann = k == Kind.ANNOTATION
        host_compute = host(op & ~tb.comm & ~comm_thread)
        host_comm = host((op | ann) & tb.comm)
        # Thread busy time: CPU ops; on communication threads also their collective ranges (gloo's
        # run loop records its work as gloo:* annotations, not ops).
        threads = {name: host((op | (ann & comm_thread & tb.comm)) & (tk == i))
                   for i, name in enumerate(ThreadKind.ALL)}
        names_dl = np.array([is_dataloader(nm) for nm in tb.names], dtype=bool) if tb.names else np.empty(0, dtype=bool)
        dl = (op | ann) & (names_dl[tb.name] if n else np.zeros(0, dtype=bool))
        if step is not None:
            host_span = (np.array([lo]), np.array([hi]))
        elif tb.by_step:
            chosen = np.unique(tb.step[tb.scope & (tb.step >= 0)])
            host_span = iv.merge(tb.steps[chosen, 0], tb.steps[chosen, 1])
        else:  # the whole trace: first to last host event, on any thread
            hm = sel & (op | ann | (k == Kind.RUNTIME) | (k == Kind.PYTHON) | (k == Kind.STEP))
            host_span = (np.array([ts[hm].min()]), np.array([end[hm].max()])) if hm.any() else iv.empty()
        return cls(compute=compute, comm=comm, memory=iv.union(mcp, mst), memcpy=mcp, memset=mst,
                   device_span=device_span, host_compute=host_compute, host_comm=host_comm, host_span=host_span,
                   runtime=host(k == Kind.RUNTIME), dataloader=host(dl),
                   host_ops=host((op | ann | (k == Kind.PYTHON)) & ~tb.comm), threads=threads,
                   collectives=comm if collective_source((kernel & tb.comm & tb.scope).any()) == ON_DEVICE
                   else host_comm)
