"""per_role: one config holding per-role ranks, steps, backend options (as verl and RLinf choose them per role)."""

import json
from functools import partial

import pytest
from conftest import config

from distprof import Profiler
from distprof.analysis.check import check_run

_config = partial(config, steps=[1])


def test_per_role_settings_merge_over_the_top_level(tmp_path):
    c = _config(tmp_path, per_role={"actor": {"ranks": "all", "steps": [2, 3], "torch": {"record_shapes": True}},
                                    "roll*": {"enable": False}, "rollout_b": {"ranks": [1]}})
    actor = c.for_role("actor")
    assert actor.ranks == "all" and actor.steps == [2, 3]
    assert actor.torch.record_shapes and actor.torch.activities == ["cpu"]  # nested sections merge key by key
    assert c.for_role("rollout_b").enable is False  # the first matching key wins ("roll*")
    assert c.for_role("ref") is c and c.for_role("ref").ranks == [0]


def test_roles_run_with_their_own_settings(tmp_path):
    c = _config(tmp_path, per_role={"actor": {"ranks": "all"}, "rollout": {"enable": False}})
    for rank in range(2):
        for role in ("actor", "rollout", "ref"):
            with Profiler(c, role=role, rank=rank, world_size=2) as prof:
                for _ in range(3):
                    prof.step()
    root = tmp_path / "run"
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("*/rank*")) == [
        "actor/rank00000", "actor/rank00001", "ref/rank00000"]
    assert json.loads((root / "actor" / "role.json").read_text())["config"]["ranks"] == "all"
    res = check_run(str(root))
    assert res.ok and sorted((i.role, i.rank) for i in res.items) == [("actor", 0), ("actor", 1), ("ref", 0)]


def test_per_role_errors_name_the_role_the_field_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"per_role\.actor\.ranks must hold whole numbers, got 'x'"):
        _config(tmp_path, per_role={"actor": {"ranks": "x"}})
    with pytest.raises(ValueError, match="per_role.actor sets save_path, which are the same for every role"):
        _config(tmp_path, per_role={"actor": {"save_path": "elsewhere"}})
    with pytest.raises(ValueError, match="would write outside save_path"):
        _config(tmp_path, per_role={"../x": {"ranks": "all"}})
    with pytest.raises(ValueError, match=r"per_role\.actor\.rank=0: unknown setting; did you mean 'ranks'\?"):
        _config(tmp_path, per_role={"actor": {"rank": 0}})


def test_environment_still_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTPROF_RANKS", "all")
    c = _config(tmp_path, per_role={"actor": {"ranks": [1]}})
    assert c.for_role("actor").ranks == "all"
