"""Rank selection by parallel coordinates: one rank per pipeline stage, rank 0 of every node.

A 3-D parallel job lays its global ranks out on a mesh (torchtitan's ``ParallelDims``, Megatron's
``tp-cp-ep-dp-pp`` order, any ``torch.distributed.DeviceMesh``). Users select by coordinates:
``ranks: {pp: "*", tp: 0, dp: 0}`` is "the first tensor- and data-parallel rank of every pipeline
stage". :class:`RankMesh` maps a global rank to its coordinates; :func:`mesh_selected` applies a
coordinate selection. Pure logic: no torch import (a DeviceMesh is read through its attributes).

Layout rule for dims given by hand: row-major, outermost dimension first, the last one varying
fastest, exactly as ``torch.arange(world).reshape(shape)`` and ``init_device_mesh(..., shape,
mesh_dim_names=names)`` lay ranks out. ``{"pp": 2, "dp": 2, "tp": 2}`` puts ranks 0 and 1 in one
tensor-parallel group and ranks 0-3 in pipeline stage 0.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANY",
    "RankMesh",
    "check_against_mesh",
    "mesh_selected",
    "node_selected",
    "parse_coordinate_selection",
    "selected_ranks",
]

ANY = "*"  # every index of a dimension


@dataclass(frozen=True)
class RankMesh:
    """Global ranks on named dimensions. ``ranks[i]`` is the global rank at flat (row-major) index i."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shape) or not self.names:
            raise ValueError(f"mesh needs one size per dimension name, got names {self.names} and shape {self.shape}")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"mesh dimension names must be distinct, got {self.names}")
        size = 1
        for n, s in zip(self.names, self.shape, strict=False):
            if isinstance(s, bool) or not isinstance(s, int) or s < 1:
                raise ValueError(f"mesh dimension {n!r} has size {s!r}; sizes are whole numbers >= 1")
            size *= s
        if len(self.ranks) != size:
            raise ValueError(f"mesh {dict(zip(self.names, self.shape, strict=False))} holds {size} ranks, "
                             f"got {len(self.ranks)}")
        if len(set(self.ranks)) != size:
            raise ValueError("mesh lists a rank twice; every global rank appears once")

    @classmethod
    def from_dims(cls, dims: Mapping[str, int] | Sequence[tuple[str, int]]) -> RankMesh:
        """From ``{"pp": 4, "dp": 2, "tp": 2}`` (outermost first), ranks laid out row-major from 0."""
        items = list(dims.items()) if isinstance(dims, Mapping) else [tuple(d) for d in dims]
        names = tuple(str(n) for n, _ in items)
        shape: tuple[int, ...] = tuple(s for _, s in items)  # type: ignore[misc]  # checked by __post_init__
        size = 1
        for s in shape:
            size *= s if isinstance(s, int) and s > 0 else 1
        return cls(names, shape, tuple(range(size)))

    @classmethod
    def from_device_mesh(cls, mesh: Any) -> RankMesh:
        """From a ``torch.distributed.DeviceMesh`` (its ``mesh`` tensor and ``mesh_dim_names``)."""
        names = getattr(mesh, "mesh_dim_names", None)
        tensor = getattr(mesh, "mesh", None)
        if tensor is None:
            raise ValueError(f"expected a torch DeviceMesh (with .mesh and .mesh_dim_names), got {type(mesh).__name__}")
        if not names:
            raise ValueError("the DeviceMesh has no mesh_dim_names; "
                             "build it with init_device_mesh(..., mesh_dim_names=(...))")
        return cls(tuple(names), tuple(int(s) for s in tensor.shape), tuple(int(r) for r in tensor.flatten().tolist()))

    @classmethod
    def of(cls, mesh: Any) -> RankMesh:
        """A RankMesh, a dims mapping / list of (name, size), or a DeviceMesh."""
        if isinstance(mesh, RankMesh):
            return mesh
        if isinstance(mesh, (Mapping, list, tuple)):
            return cls.from_dims(mesh)
        return cls.from_device_mesh(mesh)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def coords(self, rank: int) -> dict[str, int]:
        """The coordinates of global ``rank``; ValueError when the mesh does not hold it."""
        try:
            flat = self.ranks.index(rank)
        except ValueError:
            mesh = dict(zip(self.names, self.shape, strict=False))
            raise ValueError(f"rank {rank} is not in the mesh {mesh}") from None
        out: dict[str, int] = {}
        for name, size in zip(reversed(self.names), reversed(self.shape), strict=False):
            flat, out[name] = divmod(flat, size)
        return {n: out[n] for n in self.names}


def parse_coordinate_selection(spec: Mapping[Any, Any]) -> dict[str, tuple[int, ...] | str]:
    """Normalise ``{pp: "*", tp: 0, dp: [0, 1]}``: each value ``"*"``, an index, or a list of indices."""
    fix = 'give each dimension "*" (every index), an index such as 0, or a list such as [0, 2]'
    if not spec:
        raise ValueError(f"ranks selects by mesh coordinates but names no dimension; {fix}")
    out: dict[str, tuple[int, ...] | str] = {}
    for dim, value in spec.items():
        if not isinstance(dim, str) or not dim:
            raise ValueError(f"ranks: mesh dimension names are strings such as 'pp', got {dim!r}")
        if value == ANY:
            out[dim] = ANY
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        idx = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"ranks.{dim} = {value!r} is not a coordinate; {fix}")
            idx.append(v)
        if not idx:
            raise ValueError(f"ranks.{dim} is an empty list, so no rank would capture; {fix}")
        out[dim] = tuple(sorted(set(idx)))
    return out


def check_against_mesh(selection: Mapping[str, Any], mesh: RankMesh) -> None:
    """Refuse dimensions the mesh lacks and indices past a dimension's size, with the fix."""
    sizes = dict(zip(mesh.names, mesh.shape, strict=False))
    for dim, value in selection.items():
        if dim not in sizes:
            close = difflib.get_close_matches(dim, list(sizes), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"ranks selects mesh dimension {dim!r}, but the mesh has {', '.join(mesh.names)}.{hint}")
        if value != ANY:
            bad = [i for i in value if i >= sizes[dim]]
            if bad:
                raise ValueError(f"ranks.{dim} = {list(value)}: index {bad[0]} is past the dimension's size "
                                 f"{sizes[dim]} (indices 0..{sizes[dim] - 1})")


def mesh_selected(selection: Mapping[str, Any], mesh: RankMesh, rank: int) -> bool:
    """True when ``rank``'s coordinates match every dimension the selection names (unnamed ones: any)."""
    coords = mesh.coords(rank)
    return all(value == ANY or coords[dim] in value for dim, value in selection.items())


def node_selected(per_node: int | None, local_rank: int | None) -> bool:
    """``per_node: N`` keeps the first N local ranks of every node; None keeps every rank."""
    return per_node is None or (local_rank is not None and local_rank < per_node)


def selected_ranks(selection: Mapping[str, Any], mesh: RankMesh) -> list[int]:
    """Every global rank the selection picks (for messages and `validate`)."""
    return sorted(r for r in mesh.ranks if mesh_selected(selection, mesh, r))

