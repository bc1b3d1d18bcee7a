"""Every script in examples/ runs on CPU as documented, and produces what its docstring says."""

import json
import os
import sys

import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once
from conftest import REPO

EXAMPLES = os.path.join(REPO, "examples")


def run(name, tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTPROF_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    proc = warmpython.run([sys.executable, os.path.join(EXAMPLES, name), str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, tmp_path / "out"


def test_every_example_is_tested():
    tested = {"verl_discrete_worker_groups.py", "skyrl_policy_trainer.py", "rlinf_profiled_worker_groups.py",
              "slime_profile_targets.py", "swift_hf_trainer_roles.py"}
    assert {n for n in os.listdir(EXAMPLES) if n.endswith(".py")} == tested


@pytest.mark.xdist_group("ray")
def test_verl_discrete_worker_groups(tmp_path):
    out, _ = run("verl_discrete_worker_groups.py", tmp_path)
    files = {line for line in out.split() if line.endswith(".pt.trace.json.gz")}
    # Per-role ranks (actor: all, rollout: [0]); verl's steps 1 and 2; one trace per stage run.
    assert files == {f"{role}/rank{r:05d}/step{s:08d}-{s:08d}.stage-{stage}.pt.trace.json.gz"
                     for s in (1, 2)
                     for role, r, stage in [("actor", 0, "actor-compute_log_prob"), ("actor", 0, "actor-update_actor"),
                                            ("actor", 1, "actor-compute_log_prob"), ("actor", 1, "actor-update_actor"),
                                            ("rollout", 0, "rollout-generate")]}


@pytest.mark.slow
def test_skyrl_policy_trainer(tmp_path):
    out, root = run("skyrl_policy_trainer.py", tmp_path)
    for r in (0, 1):
        [line] = [x for x in out.splitlines() if x.startswith(f"rank {r}:")]
        assert "policy/ppo_train" in line  # the per-rank summary of the window
        manifest = [json.loads(x) for x in (root / "policy" / f"rank{r:05d}" / "manifest.jsonl").read_text().splitlines()]
        assert [m["steps"] for m in manifest] == [[2, 3]] and manifest[0]["world_size"] == 2


@pytest.mark.xdist_group("ray")
def test_rlinf_profiled_worker_groups(tmp_path):
    out, root = run("rlinf_profiled_worker_groups.py", tmp_path)
    [path] = [x for x in out.split() if x.startswith("rollout/py_spy-pid")]
    data = json.loads((root / "profile" / path).read_text())
    assert "speedscope" in data["$schema"]


@pytest.mark.slow
def test_slime_profile_targets(tmp_path):
    out, root = run("slime_profile_targets.py", tmp_path)
    # Only the target the flags name captures, on rollout ids 2-3 (slime's end is exclusive).
    assert out.split(":")[0] == "train_log_probs"
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("*/rank*/*.gz")) == [
        "train_log_probs/rank00000/step00000002-00000003.pt.trace.json.gz"]


@pytest.mark.slow
def test_swift_hf_trainer_roles(tmp_path):
    out, root = run("swift_hf_trainer_roles.py", tmp_path)
    [trace] = (root / "profile" / "main" / "rank00000").glob("step00000002-00000003.pt.trace.json.gz")
    import gzip

    with gzip.open(trace, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"}
    assert {"swift/compute_loss", "train/forward", "train/backward", "train/optimizer", "ProfilerStep#2"} <= names
