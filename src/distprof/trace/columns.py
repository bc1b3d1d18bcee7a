"""What reading keeps of a stream of lean events before the table is finished: :class:`Columns`, the per-batch
reduction into ``array`` columns and the names, threads and args found, and :func:`reduce_run`, the same for a
run of events decoded in a worker (one big file on several cores) and appended in file order.

Each batch is reduced column by column with map() over attribute getters, so the per-event work runs in C;
only the ``args`` the analyses need are decoded (correlation and External ids, stream, collective metadata),
for device work and the runtime calls that launch it, in one decoder call per batch. The input shapes of the CPU ops
FLOPs are computed for (:data:`~distprof.trace.vocab.SHAPED_OPS`) are decoded too, while the trace has them: the
stream's first such op without ``Input Dims`` (``record_shapes`` off) ends that for the stream (a one-process
read then decodes no more), whatever batch or run it falls in.
"""

from __future__ import annotations

import logging
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from itertools import compress, count, islice, repeat
from operator import attrgetter, is_
from typing import Any, Generic, TypeVar

import msgspec
import numpy as np

from distprof.trace.commargs import CommArgs, comm_args
from distprof.trace.events import Complete, Instant, Int64, Meta
from distprof.trace.runs import Tail, decode_run
from distprof.trace.selection import Selection
from distprof.trace.vocab import KIND_OF_CATEGORY, SHAPED_OPS, Kind

logger = logging.getLogger(__name__)

__all__ = ["Columns", "dense", "final_streams", "reduce_run"]


class _Args(msgspec.Struct, gc=False):
    """The args analyses use; every other key is skipped by the decoder without building it."""
    correlation: Int64 | None = None  # ids land in int64 columns: a bigger number makes the args unusable
    external_id: Int64 | None = msgspec.field(default=None, name="External id")
    stream: Int64 | str | None = None
    pg: str | int | None = msgspec.field(default=None, name="Process Group Name")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    # Sizes and group of a collective (trace.commargs checks them): any JSON value, so an odd one costs only itself.
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    group_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_desc: Any = msgspec.field(default=None, name="Process Group Description")
    seq: Any = msgspec.field(default=None, name="Seq")
    in_splits: Any = msgspec.field(default=None, name="In split size")
    out_splits: Any = msgspec.field(default=None, name="Out split size")


class _OpArgs(msgspec.Struct, gc=False):
    """The tensors' dims and types a ``nccl:*`` range records (older traces: :func:`~.commargs.from_input_dims`);
    a range whose op args are of the wrong shape (any of these four) records none."""
    dims: list[Any] | None = msgspec.field(default=None, name="Input Dims")
    types: list[Any] | None = msgspec.field(default=None, name="Input type")
    concrete: list[Any] | None = msgspec.field(default=None, name="Concrete Inputs")
    seq: Int64 | None = msgspec.field(default=None, name="Sequence number")


class _ShapeArgs(msgspec.Struct, gc=False):
    """The args of a CPU op that FLOPs and bytes are computed from (``record_shapes``). The three lists stay JSON
    (:func:`shape_key`): an op's shapes are decoded once per distinct value, where FLOPs are computed."""
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    seq: Int64 | None = msgspec.field(default=None, name="Sequence number")


# One op's (Input Dims, Input type, Concrete Inputs) as one key: their JSON, each a list or null ("" where absent),
# joined by a byte no JSON text holds. :func:`shape_of` decodes it.
_shape_decoder = msgspec.json.Decoder(tuple[list[Any] | None, list[Any] | None, list[Any] | None])


def shape_key(a: _ShapeArgs) -> bytes | None:
    """The op's shape key, or None when it has no ``Input Dims`` or a field that is not a list (the op counts no
    FLOPs, as when its args were of the wrong shape)."""
    d = bytes(a.dims)
    if d[:1] != b"[":  # absent, null, or not a list
        return None
    t = bytes(a.types) or b"null"
    c = bytes(a.concrete) or b"null"
    if (t[:1] != b"[" and t != b"null") or (c[:1] != b"[" and c != b"null"):
        return None
    return b"%b\0%b\0%b" % (d, t, c)


def shape_of(key: bytes) -> tuple[list | None, list | None, list | None] | None:
    """(Input Dims, Input type, Concrete Inputs) of a :func:`shape_key`; None when they do not decode."""
    try:
        return _shape_decoder.decode(b"[" + key.replace(b"\0", b",") + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


class _MemArgs(msgspec.Struct, gc=False):
    """The args of a ``[memory]`` instant event (``profile_memory``): the allocator's totals after it."""
    allocated: Int64 | None = msgspec.field(default=None, name="Total Allocated")
    reserved: Int64 | None = msgspec.field(default=None, name="Total Reserved")
    bytes: Int64 | None = msgspec.field(default=None, name="Bytes")
    addr: Int64 | None = msgspec.field(default=None, name="Addr")
    device_type: Int64 | None = msgspec.field(default=None, name="Device Type")
    device_id: Int64 | None = msgspec.field(default=None, name="Device Id")


_mem_decoder = msgspec.json.Decoder(_MemArgs)
_T = TypeVar("_T")


class _MetaArgs(msgspec.Struct):
    name: str | None = None


_meta_decoder = msgspec.json.Decoder(_MetaArgs)
_CAT, _NAME, _TS, _DUR, _PID, _TID = (attrgetter(f) for f in ("cat", "name", "ts", "dur", "pid", "tid"))
_IS_X, _IS_M = partial(is_, Complete), partial(is_, Meta)  # lean events: the class is the phase
_IS_I = partial(is_, Instant)
_ARGS = attrgetter("args")
_CORR, _EXT, _STREAM, _PG, _COLL = (attrgetter(f) for f in ("correlation", "external_id", "stream", "pg", "collective"))
_SIZES = attrgetter("in_nelems", "out_nelems", "dtype", "group_size", "group_ranks", "group_desc", "seq", "in_splits",
                    "out_splits")
# the ranges older traces record a collective's tensors' shapes on (trace.commargs.from_input_dims)
_COMM_RANGES = ("nccl:", "rccl:", "gloo:", "c10d::alltoall_base_", "c10d::_allgather_base_",
                "c10d::_reduce_scatter_base_")

# Kinds whose args are decoded: device work and the runtime calls that launch it (correlation ids).
_NEEDS_ARGS = [False] * 16
for _k in (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.RUNTIME, Kind.DEVICE_SYNC, Kind.GPU_ANNOTATION):
    _NEEDS_ARGS[_k] = True


class _ArgsDecoder(Generic[_T]):
    """One args struct's decoders. ``one(raw)``: the struct, or its defaults where the args are absent or of the
    wrong shape (the event still counts, without what they would have given). ``many(raws)``: a batch's in one
    decoder call (not one per event); if any is of the wrong shape, each on its own, so only that one loses it."""

    def __init__(self, t: type[_T]) -> None:
        self._one = msgspec.json.Decoder(t)
        self._many = msgspec.json.Decoder(list[t])  # type: ignore[valid-type]
        self.none = t()

    def one(self, raw: msgspec.Raw | bytes | bytearray) -> _T:
        if not raw:
            return self.none
        try:
            return self._one.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return self.none

    def many(self, raws: list) -> list[_T]:
        try:
            return self._many.decode(b"[" + b",".join([r if r else b"{}" for r in raws]) + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return list(map(self.one, raws))


_ARGS_DECODER, _OPS_DECODER = _ArgsDecoder(_Args), _ArgsDecoder(_OpArgs)
_decode_args, _decode_many = _ARGS_DECODER.one, _ARGS_DECODER.many  # device work's links, record_param_comms
_decode_ops = _OPS_DECODER.many  # nccl:* ranges' tensors
_decode_shapes = _ArgsDecoder(_ShapeArgs).many  # the shaped ops' shapes (as JSON)


def _or_minus_one(values: list) -> list:
    return [-1 if v is None else v for v in values] if None in values else values


def dense(sparse: array, ids: dict[Any, int]) -> np.ndarray:
    """Ids a counter handed out (one number per event seen) -> 0..len(ids)-1, in first-seen order (the
    order of ``ids``' keys, which ``names`` and ``tracks`` follow)."""
    if not ids:
        return np.empty(0, dtype=np.int32)
    remap = np.zeros(max(ids.values()) + 1, dtype=np.int32)
    remap[np.fromiter(ids.values(), dtype=np.int64, count=len(ids))] = np.arange(len(ids), dtype=np.int32)
    return remap[np.frombuffer(sparse, dtype=np.int64)]



class Columns:
    """What reading keeps of a stream of events before the table is finished: the columns as ``array``\\ s, and
    the names, threads and args found. Built batch by batch (:meth:`add`); the columns of a run of events
    reduced elsewhere (a worker, for one big file) are appended in file order with :meth:`extend`."""

    def __init__(self) -> None:
        # Names and threads get ids from a counter, so setdefault can run over a whole batch in C (map, no
        # bytecode per event); the ids are sparse (one number per event seen) and made dense (:func:`dense`) when
        # the table is finished.
        self.name_ids: dict[str, int] = {}
        self.track_ids: dict[Any, int] = {}
        self._name_seq, self._track_seq = count(), count()
        self.ts, self.dur, self.kind = array("d"), array("d"), array("b")
        self.name, self.track = array("q"), array("q")
        self.arg_i, self.arg_corr, self.arg_ext, self.arg_stream = array("q"), array("q"), array("q"), array("q")
        self.streams: dict[Any, int] = {}
        self.meta: dict[int, tuple[Any, Any]] = {}  # event index -> (group, collective) of comm events
        self.rpc_ext: dict[int, tuple[Any, Any]] = {}  # record_param_comms External id -> (group, collective)
        self.sizes: dict[int, CommArgs] = {}  # event index -> the recorded sizes of comm events that have them
        self.rpc_sizes: dict[int, CommArgs] = {}  # record_param_comms External id -> its recorded sizes
        self.thread_names: dict[Any, str] = {}
        # profile_memory's [memory] events: (ts, Total Allocated, Total Reserved, Bytes, Addr, Device Type, Device Id)
        self.memory: list[tuple[float, int, int, int, int, int, int]] = []
        self.unknown: Counter = Counter()
        self.events = 0  # every event decoded (complete or not)
        # The SHAPED_OPS with shapes: event index, shape key id (shape_keys: key -> id, :func:`shape_key`) and
        # autograd Sequence number (-1: none); has_shapes: None until a batch holds such an op, then whether they
        # carry shapes (False: no more are decoded).
        self.shape_ev, self.shape_key, self.shape_seq = array("q"), array("q"), array("q")
        self.shape_keys: dict[bytes, int] = {}
        self.has_shapes: bool | None = None
        self._shaped_ids: set[int] = set()  # name ids (sparse) of SHAPED_OPS names
        self._names_checked = 0  # how many of name_ids were checked against SHAPED_OPS
        # event index -> (Input Dims, Input type) of ``nccl:*`` ranges and c10d base ops (older traces' sizes)
        self.comm_dims: dict[int, tuple[Any, Any]] = {}
        self._comm_range_ids: set[int] = set()
        self._comm_names_checked = 0

    def __getstate__(self) -> dict:  # (the id counters stay behind: a reduced run is only ever appended)
        return {k: v for k, v in self.__dict__.items() if k not in ("_name_seq", "_track_seq")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _name_seq=None, _track_seq=None)

    def read(self, t, sel: Selection, pool: Any | None = None, reduce: Any = None) -> bool | None:
        """Every batch of the stream ``t``: True; False when the file's rank or role is not selected (reading
        stops there); None when a run the ``pool`` took could not be decoded whole (read it again without).
        ``reduce``: what the pool reduces each run with (:func:`reduce_run` unless the native decoder's)."""
        reduce = reduce or reduce_run
        checked = False
        runs: list = []  # in file order: futures of runs reduced in the pool, Columns of batches read here
        for batch in (t.batches(defer=True) if pool is not None else t.batches()):
            if not checked:
                checked = True
                if not (sel.rank_ok(t.rank) and sel.role_ok(t.role)):
                    return False  # leaving the loop closes the file: nothing more is read
            if pool is None:
                self.add(batch)
                continue
            if isinstance(batch, list):
                here = Columns()
                here.add(batch)
                runs.append(here)
            elif isinstance(batch, Tail):
                tail = reduce(batch.data)
                if tail is None:  # (as a run the pool could not decode whole)
                    _cancel(runs)
                    return None
                runs.append(tail)
            else:
                try:
                    runs.append(pool.submit(reduce, batch))
                except BrokenProcessPool:  # (a worker died before this run: see _drain)
                    _cancel(runs)
                    return None
            if not self._drain(runs, pool.backlog):
                return None
        if pool is not None and t.needs_whole_read:
            _cancel(runs)
            return None
        return True if self._drain(runs, 0) else None

    def _drain(self, runs: list, keep: int) -> bool:
        """Append finished runs in order; wait for the oldest while more than ``keep`` are unfinished (bounded
        memory)."""
        while runs:
            first = runs[0]
            if not isinstance(first, Columns):
                if len(runs) <= keep and not first.done():
                    return True
                try:
                    first = first.result()
                except BrokenProcessPool:  # a worker died (the OOM killer ...): every run in flight is lost
                    logger.info("a worker reading runs of events died")
                    first = None
                if first is None:
                    _cancel(runs)
                    return False
            runs.pop(0)
            self.extend(first)
        return True

    def add(self, batch: list) -> None:
        """Reduce one batch of lean events. Each batch is reduced column by column with map() over attribute
        getters: the per-event work runs in C, far fewer interpreter steps than one loop body per event."""
        base = len(self.ts)  # index of the batch's first complete event in the table
        self.events += len(batch)
        types = list(map(type, batch))
        xs = batch if types.count(Complete) == len(types) else list(compress(batch, map(_IS_X, types)))
        if len(xs) != len(batch) and Meta in types:
            self._thread_names(compress(batch, map(_IS_M, types)))
        if len(xs) != len(batch) and Instant in types:
            self._memory(compress(batch, map(_IS_I, types)))
        if not xs:
            return
        unk = Kind.UNKNOWN
        ks = list(map(KIND_OF_CATEGORY.get, map(_CAT, xs), repeat(unk)))
        if unk in ks:
            self.unknown.update(e.cat for e, k in zip(xs, ks, strict=True) if k == unk)
        nids = list(map(self.name_ids.setdefault, map(_NAME, xs), self._name_seq))
        self.ts.extend(map(_TS, xs))
        self.dur.extend(map(_DUR, xs))
        self.kind.extend(ks)
        self.name.extend(nids)
        threads = zip(map(_PID, xs), map(_TID, xs), strict=True)
        self.track.extend(map(self.track_ids.setdefault, threads, self._track_seq))
        need = list(compress(range(len(xs)), map(_NEEDS_ARGS.__getitem__, ks)))
        if need:
            self._add_args(xs, need, base)
        self._add_tail(lambda js: [xs[j].args for j in js], nids, base)

    def _add_tail(self, args_of: Callable[[list[int]], list], nids: list[int], base: int) -> None:
        """The args decoded for a few events of a batch (``args_of(js)``: the raw args of the batch's events ``js``):
        record_param_comms' collective metadata,
        the shaped ops' shapes, the ``nccl:*`` ranges' tensors."""
        rpc = self.name_ids.get("record_param_comms")
        if rpc is not None and rpc in nids:
            self._add_rpc(args_of, list(compress(range(len(nids)), map(rpc.__eq__, nids))), base)
        if self.has_shapes is not False:
            self._add_shapes(args_of, nids, base)
        self._add_comm_dims(args_of, nids, base)

    def _add_comm_dims(self, args_of: Callable[[list[int]], list], nids: list[int], base: int) -> None:
        """The ``Input Dims`` / ``Input type`` of the batch's ``nccl:*`` ranges (a few per step; see
        :func:`~distprof.trace.commargs.from_input_dims`)."""
        if len(self.name_ids) != self._comm_names_checked:
            for nm, sid in islice(self.name_ids.items(), self._comm_names_checked, None):
                if nm.startswith(_COMM_RANGES):
                    self._comm_range_ids.add(sid)
            self._comm_names_checked = len(self.name_ids)
        if not self._comm_range_ids:
            return
        need = list(compress(range(len(nids)), map(self._comm_range_ids.__contains__, nids)))
        for j, a in zip(need, _decode_ops(args_of(need)), strict=True):
            if a.dims:
                self.comm_dims[base + j] = (a.dims, a.types)

    def _add_shapes(self, args_of: Callable[[list[int]], list], nids: list[int], base: int) -> None:
        """The input shapes of the batch's SHAPED_OPS (one decoder call). The stream's first such op decides
        ``has_shapes``: without ``Input Dims`` (the trace was written without record_shapes) it is False and no
        later batch is decoded; its shapes are the ones taken (:meth:`extend`, the table). A rule of the first op,
        not of the first batch, so that where a stream is cut (batches, runs) never changes the answer."""
        if len(self.name_ids) != self._names_checked:  # names first seen in this batch
            for nm, sid in islice(self.name_ids.items(), self._names_checked, None):
                if nm in SHAPED_OPS:
                    self._shaped_ids.add(sid)
            self._names_checked = len(self.name_ids)
        if not self._shaped_ids:
            return
        need = list(compress(range(len(nids)), map(self._shaped_ids.__contains__, nids)))
        if not need:
            return
        ops = _decode_shapes(args_of(need))
        keys = [shape_key(a) for a in ops]
        if self.has_shapes is None:  # (decoded whole, as the op's args once were: numbers out of range count)
            self.has_shapes = keys[0] is not None and shape_of(keys[0]) is not None
        ids = self.shape_keys
        have = [k is not None for k in keys]  # (kept even when False: a run reduced apart may follow)
        self.shape_ev.extend([base + j for j in compress(need, have)])
        self.shape_key.extend([ids.setdefault(k, len(ids)) for k in keys if k is not None])
        self.shape_seq.extend([-1 if a.seq is None else a.seq for a in compress(ops, have)])

    def _memory(self, instants: Iterable[Instant]) -> None:
        """The allocator's figures of the batch's ``[memory]`` events (an event whose args do not fit is left out)."""
        for e in instants:
            if e.name != "[memory]" or not e.args:
                continue
            try:
                a = _mem_decoder.decode(e.args)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                continue
            if a.allocated is not None:
                self.memory.append((e.ts, a.allocated, a.reserved or 0, a.bytes or 0, a.addr or 0,
                                    -1 if a.device_type is None else a.device_type,
                                    -1 if a.device_id is None else a.device_id))

    def _thread_names(self, metas: Iterable[Meta]) -> None:
        """Thread names from the batch's metadata events."""
        for e in metas:
            if e.name == "thread_name" and e.args:
                try:
                    nm = _meta_decoder.decode(e.args).name
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                    nm = None
                if nm:
                    self.thread_names[(e.pid, e.tid)] = nm

    def _add_args(self, xs: list, need: list[int], base: int) -> None:
        """The args of the complete events ``xs[j]`` for ``j`` in ``need`` (device work and its launches): ids,
        stream, collective metadata, all decoded in one call."""
        evs = list(map(xs.__getitem__, need))
        self._add_links(evs, need, _decode_many(list(map(_ARGS, evs))), base)

    def _add_links(self, evs: list, need: list[int], al: list[_Args], base: int) -> None:
        """The decoded args ``al`` of the events ``evs`` (rows ``need`` of the batch): ids, stream (the thread's
        id, ``evs[k].tid``, where the args name none), collective metadata and sizes."""
        self.arg_i.extend(map(base.__add__, need))
        self.arg_corr.extend(_or_minus_one(list(map(_CORR, al))))
        self.arg_ext.extend(_or_minus_one(list(map(_EXT, al))))
        sts = list(map(_STREAM, al))
        if None in sts:  # no stream arg: the device thread's id stands for it
            sts = [e.tid if st is None else st for st, e in zip(sts, evs, strict=True)]
        self.arg_stream.extend(self._stream_ids(sts))
        pgs, colls = list(map(_PG, al)), list(map(_COLL, al))
        if pgs.count(None) != len(pgs) or colls.count(None) != len(colls):
            for j, g, c, a in zip(need, pgs, colls, al, strict=True):
                if g is not None or c is not None:
                    self.meta[base + j] = (g, c)
                    sizes = comm_args(*_SIZES(a))
                    if sizes is not None:
                        self.sizes[base + j] = sizes

    def _stream_ids(self, sts: list) -> list[int]:
        """The numbers of streams ``sts`` (new ones get one, first seen first)."""
        streams = self.streams
        sids: list[Any] = list(map(streams.get, sts))
        if None in sids:
            for st in dict.fromkeys(st for st, sid in zip(sts, sids, strict=True) if sid is None):  # (first seen first)
                streams[st] = _stream_id(st, len(streams))
            sids = list(map(streams.__getitem__, sts))
        return sids

    def _add_rpc(self, args_of: Callable[[list[int]], list], rpcs: list[int], base: int) -> None:
        """The collective metadata of the record_param_comms ops ``rpcs`` (rows of the batch), by event and by
        External id (the kernels they launch take it)."""
        for j, raw in zip(rpcs, args_of(rpcs), strict=True):
            a = _decode_args(raw)
            if a.pg is not None or a.collective is not None:
                self.meta[base + j] = (a.pg, a.collective)
                sizes = comm_args(*_SIZES(a))
                if sizes is not None:
                    self.sizes[base + j] = sizes
                if a.external_id is not None:
                    self.rpc_ext[a.external_id] = (a.pg, a.collective)
                    if sizes is not None:
                        self.rpc_sizes[a.external_id] = sizes

    def extend(self, other: Columns) -> None:
        """Append the columns of the events that follow this stream's (reduced on their own): ids renumbered."""
        base = len(self.ts)
        self.events += other.events
        self.ts.extend(other.ts)
        self.dur.extend(other.dur)
        self.kind.extend(other.kind)
        self.name.extend(_renumber(other.name, other.name_ids, self.name_ids, self._name_seq))
        self.track.extend(_renumber(other.track, other.track_ids, self.track_ids, self._track_seq))
        self.arg_i.extend(array("q", (np.frombuffer(other.arg_i, dtype=np.int64) + base).tobytes())
                          if len(other.arg_i) else b"")
        self.arg_corr.extend(other.arg_corr)
        self.arg_ext.extend(other.arg_ext)
        # Streams that are not ids got a number by order of appearance: give them this stream's numbers.
        moved = {}
        for st, sid in other.streams.items():
            if st not in self.streams:
                self.streams[st] = _stream_id(st, len(self.streams))
            if self.streams[st] != sid:
                moved[sid] = self.streams[st]
        self.arg_stream.extend(array("q", [moved.get(v, v) for v in other.arg_stream]) if moved else other.arg_stream)
        self.meta.update({base + j: m for j, m in other.meta.items()})
        self.rpc_ext.update(other.rpc_ext)
        # _add_shapes' rule across runs: the stream's first shaped op decides (the first part that has one);
        # a part's shapes are taken only when that decision is True.
        if other.has_shapes is not None:
            if self.has_shapes is None:
                self.has_shapes = other.has_shapes
            if self.has_shapes and len(other.shape_ev):
                self.shape_ev.extend(array("q", (np.frombuffer(other.shape_ev, dtype=np.int64) + base).tobytes()))
                self.shape_key.extend(_renumber(other.shape_key, other.shape_keys, self.shape_keys,
                                                count(len(self.shape_keys))))
                self.shape_seq.extend(other.shape_seq)
        self.sizes.update({base + j: m for j, m in other.sizes.items()})
        self.rpc_sizes.update(other.rpc_sizes)
        self.comm_dims.update({base + j: v for j, v in other.comm_dims.items()})
        self.thread_names.update(other.thread_names)
        self.memory.extend(other.memory)
        self.unknown.update(other.unknown)


def _cancel(runs: list) -> None:
    """Cancel the runs not yet started in the pool (their file is read again in one process)."""
    for r in runs:
        if not isinstance(r, Columns):
            r.cancel()


def _stream_id(st: Any, known: int) -> int:
    """A stream's number while reading: the stream id itself, or (a name, a negative number) a negative number
    by order of appearance, which no real id can take (so runs reduced apart are renumbered by key without
    mistaking a real id for a name's); :func:`final_streams` makes it ``10**15 + order``."""
    return st if isinstance(st, int) and st >= 0 else -2 - known


def final_streams(sids: np.ndarray) -> np.ndarray:
    """The stream numbers a table shows: a name's (or a negative id's) one past every plausible real id."""
    return np.where(sids <= -2, 10**15 - 2 - sids, sids)


def _renumber(sparse: array, theirs: dict[Any, int], ours: dict[Any, int], seq) -> array:
    """Ids handed out by another :class:`Columns` (``theirs``: key -> id) as ids of ours (new keys get new ids)."""
    if not len(sparse):
        return array("q")
    lut = np.zeros(max(theirs.values()) + 1, dtype=np.int64)
    for key, tid in theirs.items():
        oid = ours.get(key)
        if oid is None:
            oid = ours[key] = next(seq)
        lut[tid] = oid
    return array("q", lut[np.frombuffer(sparse, dtype=np.int64)].tobytes())


def reduce_run(data: bytes | bytearray) -> Columns | None:
    """A run of whole events (cut from one file's events list by the reader) decoded and reduced, in a worker;
    None when it does not decode whole as lean events (the file is then read again on the salvaging path)."""
    events = decode_run(data)
    if events is None:
        return None
    cols = Columns()
    cols.add(events)
    return cols
