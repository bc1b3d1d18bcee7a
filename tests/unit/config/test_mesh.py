"""Rank selection by parallel coordinates (pure logic, property-tested) and on a real torch DeviceMesh."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distprof.config.mesh import (
    ANY,
    RankMesh,
    check_against_mesh,
    mesh_selected,
    node_selected,
    parse_coordinate_selection,
    selected_ranks,
)

NAMES = ["pp", "dp", "cp", "tp", "ep"]


@st.composite
def meshes(draw):
    n = draw(st.integers(1, 4))
    names = draw(st.permutations(NAMES))[:n]
    shape = [draw(st.integers(1, 4)) for _ in names]
    return dict(zip(names, shape))


@st.composite
def mesh_and_selection(draw):
    dims = draw(meshes())
    sel = {}
    for name, size in dims.items():
        choice = draw(st.sampled_from(["skip", "any", "some"]))
        if choice == "any":
            sel[name] = ANY
        elif choice == "some":
            sel[name] = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size))
    if not sel:
        sel[next(iter(dims))] = ANY
    return dims, sel


@given(meshes())
@settings(max_examples=200, deadline=None)
def test_coords_are_numpys_row_major_layout(dims):
    mesh = RankMesh.from_dims(dims)
    grid = np.arange(mesh.world_size).reshape(tuple(dims.values()))
    for rank in range(mesh.world_size):
        c = mesh.coords(rank)
        assert list(c) == list(dims)  # in the mesh's own order
        assert grid[tuple(c.values())] == rank


@given(mesh_and_selection())
@settings(max_examples=300, deadline=None)
def test_selection_is_the_brute_force_filter(case):
    dims, raw = case
    mesh = RankMesh.from_dims(dims)
    sel = parse_coordinate_selection(raw)
    check_against_mesh(sel, mesh)
    grid = np.arange(mesh.world_size).reshape(tuple(dims.values()))
    expected = set()
    for idx in itertools.product(*(range(s) for s in dims.values())):
        coords = dict(zip(dims, idx))
        if all(raw.get(d, ANY) == ANY or coords[d] in raw[d] for d in dims):
            expected.add(int(grid[idx]))
    assert set(selected_ranks(sel, mesh)) == expected
    # Naming every dimension "*" is the same as naming none of them: every rank.
    assert selected_ranks({d: ANY for d in dims}, mesh) == list(range(mesh.world_size))


def test_one_rank_per_pipeline_stage():
    mesh = RankMesh.from_dims({"pp": 4, "dp": 2, "tp": 2})
    sel = parse_coordinate_selection({"pp": "*", "tp": 0, "dp": 0})
    assert selected_ranks(sel, mesh) == [0, 4, 8, 12]
    assert mesh_selected(sel, mesh, 4) and not mesh_selected(sel, mesh, 5)


def test_real_device_mesh_in_any_layout():
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        # A mesh whose ranks are not in row-major order (pipeline stages reversed): coordinates come from the
        # mesh tensor, not from arithmetic on the rank.
        layout = torch.arange(8).reshape(2, 2, 2).flip(0)
        dm = DeviceMesh("cpu", layout, mesh_dim_names=("pp", "dp", "tp"), _init_backend=False)
        mesh = RankMesh.of(dm)
        assert mesh.coords(0) == {"pp": 1, "dp": 0, "tp": 0}
        assert mesh.coords(5) == {"pp": 0, "dp": 0, "tp": 1}
        assert selected_ranks(parse_coordinate_selection({"pp": "*", "dp": 0, "tp": 0}), mesh) == [0, 4]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("spec, message", [
    ({}, "names no dimension"),
    ({"pp": -1}, "not a coordinate"),
    ({"pp": "first"}, "not a coordinate"),
    ({"pp": []}, "empty list"),
    ({"pp": True}, "not a coordinate"),
])
def test_bad_selections_say_what_to_write(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_coordinate_selection(spec)


def test_selection_checked_against_the_mesh():
    mesh = RankMesh.from_dims({"pp": 2, "tp": 2})
    with pytest.raises(ValueError, match="Did you mean 'tp'"):
        check_against_mesh(parse_coordinate_selection({"tpp": 0}), mesh)
    with pytest.raises(ValueError, match="past the dimension's size 2"):
        check_against_mesh(parse_coordinate_selection({"pp": [0, 3]}), mesh)


def test_bad_meshes_are_refused():
    with pytest.raises(ValueError, match="sizes are whole numbers"):
        RankMesh.from_dims({"pp": 0})
    with pytest.raises(ValueError, match="distinct"):
        RankMesh.from_dims([("pp", 2), ("pp", 2)])
    with pytest.raises(ValueError, match="not in the mesh"):
        RankMesh.from_dims({"pp": 2}).coords(2)


def test_per_node_keeps_the_first_local_ranks_of_every_node():
    assert [node_selected(1, lr) for lr in range(4)] == [True, False, False, False]
    assert [node_selected(2, lr) for lr in range(4)] == [True, True, False, False]
    assert node_selected(None, 7) and node_selected(None, None)
    assert not node_selected(1, None)  # unknown local rank: never guessed as selected


# ---- wired into the config, the Profiler, check and worker groups -------------------------------------------
import json  # noqa: E402

from distprof import Profiler, ProfilerConfig  # noqa: E402
from distprof.analysis.check import check_run  # noqa: E402


def _run_ranks(tmp_path, world, mesh=None, local_ranks=None, **cfg):
    """Every rank of a ``world``-rank job builds its Profiler (one process each in a real job; here in turn, since
    selection is each process's own decision) and runs 3 steps."""
    config = ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[1], torch={"activities": ["cpu"]}, **cfg)
    for r in range(world):
        lr = None if local_ranks is None else local_ranks[r]
        with Profiler(config, role="train", rank=r, world_size=world, mesh=mesh, local_rank=lr) as prof:
            for _ in range(3):
                prof.step()
    root = tmp_path / "run" / "train"
    return sorted(int(p.name[4:]) for p in root.glob("rank*")) if root.exists() else []


def test_coordinate_selection_captures_one_rank_per_pipeline_stage(tmp_path):
    got = _run_ranks(tmp_path, 8, mesh={"pp": 2, "dp": 2, "tp": 2}, ranks={"pp": "*", "dp": 0, "tp": 0})
    assert got == [0, 4]
    role = json.loads((tmp_path / "run" / "train" / "role.json").read_text())
    assert role["mesh"] == {"names": ["pp", "dp", "tp"], "shape": [2, 2, 2], "ranks": list(range(8))}
    res = check_run(str(tmp_path / "run"))
    assert res.ok and sorted({i.rank for i in res.items}) == [0, 4]  # check knows which ranks should have captured


def test_coordinate_selection_needs_the_mesh_and_fitting_dimensions(tmp_path):
    config = ProfilerConfig(enable=True, save_path=str(tmp_path), ranks={"pp": "*", "tp": 0})
    with pytest.raises(ValueError, match="no mesh was given"):
        Profiler(config, rank=0, world_size=4)
    with pytest.raises(ValueError, match="Did you mean 'tp'"):
        ProfilerConfig(enable=True, save_path=str(tmp_path), ranks={"tpp": 0}).selects_rank(0, 4, {"pp": 2, "tp": 2})
    with pytest.raises(ValueError, match="mesh holds 4 ranks but world_size is 8"):
        Profiler(config, rank=0, world_size=8, mesh={"pp": 2, "tp": 2})
    with pytest.raises(ValueError, match="not a coordinate"):
        ProfilerConfig(ranks={"pp": "first"})


def test_per_node_keeps_local_rank_zero_of_every_node(tmp_path, monkeypatch):
    got = _run_ranks(tmp_path, 4, ranks="all", per_node=1, local_ranks=[0, 1, 0, 1])
    assert got == [0, 2]
    res = check_run(str(tmp_path / "run"))
    assert res.ok and any("per_node" in n for n in res.notes)
    # From the environment, as torchrun sets it.
    monkeypatch.setenv("LOCAL_RANK", "1")
    config = ProfilerConfig(enable=True, save_path=str(tmp_path / "env"), ranks="all", per_node=1)
    assert not Profiler(config, rank=3, world_size=4).enabled
    with pytest.raises(ValueError, match="per_node must be >= 1"):
        ProfilerConfig(per_node=0)


def test_worker_groups_refuse_per_node():
    from distprof.integrations.ray.workers import ProfiledGroup

    config = ProfilerConfig(enable=True, save_path="/tmp/distprof-never", ranks="all", per_node=1)
    with pytest.raises(ValueError, match="per_node=1 needs each worker's local rank"):
        ProfiledGroup([object(), object()], config, role="actor")  # refused before any call to the workers
