"""Config dialects: each framework's profiler config, as its users write it (tests/dialects/), becomes a distprof
config with the framework's defaults and semantics; `distprof validate` shows the mapping, what is dropped, every
error at once and the nothing-captured warnings. Schedules are checked against torch.profiler.schedule itself,
which is what SkyRL, slime and torchtitan drive."""

import argparse
import os

import pytest
import torch
import yaml
from tracekit import cli, load

import distprof
from distprof import Profiler, ProfilerConfig
from distprof.config.dialects import load_file
from distprof.config.dialects import translate as _translate
from distprof.config.model import ProfilerConfig as _ProfilerConfig


def translate(*args, **kwargs):  # the dialects are given the config class they validate with
    return _translate(*args, config=_ProfilerConfig, **kwargs)

HERE = os.path.join(os.path.dirname(__file__), "dialects")
VERL_ROLES = ("actor", "ref", "rollout", "critic")


def fixture(name):
    return os.path.join(HERE, name)


def by_source(t):
    return {m.source: m for m in t.mapping}


def recorded_by_torch_schedule(n, **schedule):
    """The step indices (0-based calls to step()) in which torch.profiler.schedule records."""
    sch = torch.profiler.schedule(**schedule)
    rec = (torch.profiler.ProfilerAction.RECORD, torch.profiler.ProfilerAction.RECORD_AND_SAVE)
    return [k for k in range(n) if sch(k) in rec]


def recorded_by_distprof(config, role, last):
    """The global steps in 0..last that distprof's plan for ``role`` records."""
    plan = config.for_role(role).plan()
    out, step = [], 0
    while step <= last:
        w = plan.next_window(step)
        if w is None:
            break
        out += [s for s in w.steps if s <= last]
        step = w.end + 1
    return out


# ---- verl ----------------------------------------------------------------------------------------------------
def test_verl_yaml_validates_in_one_command_and_profiles_the_steps_and_roles_verl_would(tmp_path):
    save = tmp_path / "profile"
    with open(fixture("verl_ppo_torch.yaml")) as f:
        text = f.read().replace("./outputs/profile", str(save))
    path = tmp_path / "ppo.yaml"
    path.write_text(text)

    code, out, err = cli("validate", path, "--dialect", "verl", "--json")
    assert code == 0, err
    assert out["valid"] and out["errors"] == [] and out["warnings"] == [] and out["dropped"] == []
    roles = out["roles"]
    assert {r: roles[r]["captures"] for r in VERL_ROLES} == {"actor": True, "ref": True, "rollout": False,
                                                             "critic": True}
    assert (roles["actor"]["ranks"], roles["ref"]["ranks"], roles["critic"]["ranks"]) == ("all", [1], [0])
    assert all(roles[r]["steps"] == [1, 2, 4] and roles[r]["backend"] == "torch" for r in VERL_ROLES)
    assert roles["actor"]["torch"] == {"activities": ["cpu", "cuda"], "record_shapes": True}
    assert roles["critic"]["torch"] == {"activities": ["cpu", "cuda"], "profile_memory": True, "with_stack": True}
    mapping = {(m["source"], m["target"]): m for m in out["mapping"]}
    assert mapping[("global_profiler.steps", "steps")]["result"] == [1, 2, 4]
    assert "count from 1" in mapping[("global_profiler.steps", "steps")]["note"]
    assert mapping[("actor_rollout_ref.actor.profiler.all_ranks", "per_role.actor.ranks")]["result"] == "all"
    assert mapping[("critic.profiler.ranks", "per_role.critic.ranks")]["result"] == [0]  # verl: ranks [] -> rank 0

    # The same config drives the Profilers of every verl role, stepped as verl numbers its steps (1, 2, ...).
    config = ProfilerConfig.from_dialect("verl", yaml.safe_load(text))
    for role in VERL_ROLES:
        for rank in range(2):
            with Profiler(config, role=role, global_step=1, rank=rank, world_size=2) as prof:
                for _ in range(1, 6):  # trainer.total_training_steps: 5
                    with distprof.annotate(f"{role}/update"):
                        torch.ones(16, 16) @ torch.ones(16, 16)
                    prof.step()
    files = sorted(os.path.relpath(os.path.join(d, f), save) for d, _, fs in os.walk(save) for f in fs
                   if f.endswith(".pt.trace.json.gz"))
    windows = ("step00000001-00000002.pt.trace.json.gz", "step00000004-00000004.pt.trace.json.gz")
    expected = sorted(f"{role}/rank{rank:05d}/{w}" for role, rank in
                      (("actor", 0), ("actor", 1), ("ref", 1), ("critic", 0)) for w in windows)
    assert files == expected
    names = {e["name"] for e in load(save / "actor" / "rank00001" / windows[0])["traceEvents"]}
    assert {"ProfilerStep#1", "ProfilerStep#2", "actor/update"} <= names and "ProfilerStep#3" not in names


def test_verl_composed_config_resolves_interpolations_and_maps_nsys(tmp_path):
    from omegaconf import OmegaConf

    t = translate("verl", load_file(fixture("verl_nsys_resolved.yaml")), env={})
    assert t.ok, t.errors
    # Inside verl's main the config is an OmegaConf DictConfig: the same translation, interpolations included.
    assert ProfilerConfig.from_dialect("verl", OmegaConf.load(fixture("verl_nsys_resolved.yaml"))) == t.profiler_config
    pc = t.profiler_config
    assert pc.roles == ["actor", "rollout"] and pc.steps == [1, 2, 5]
    assert pc.save_path == "outputs/profile/gsm8k"  # ${trainer.experiment_name} resolved
    actor, rollout = pc.for_role("actor"), pc.for_role("rollout")
    assert (actor.backend, actor.ranks, rollout.backend, rollout.ranks) == ("nsys", [0, 4], "nsys", "all")
    assert not pc.for_role("ref").enable and not pc.for_role("critic").enable
    assert actor.nsys.options == {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true",
                                  "cuda-graph-trace": "graph", "kill": "none"}
    dropped = {d.source: d.reason for d in t.dropped}
    assert set(dropped) == {"actor_rollout_ref.actor.profiler.tool_config.nsys.discrete",
                            "actor_rollout_ref.rollout.profiler.tool_config.nsys.discrete",
                            "actor_rollout_ref.rollout.profiler.save_path",
                            "global_profiler.global_tool_config.nsys.controller_nsight_options"}
    assert "in-process backend" in dropped["actor_rollout_ref.actor.profiler.tool_config.nsys.discrete"]
    assert "always so in distprof" in by_source(t)["global_profiler.relocate_results"].note


def test_verl_errors_are_reported_all_at_once(tmp_path):
    bad = {"global_profiler": {"tool": "torch", "steps": [0, 2]},
           "actor_rollout_ref": {"actor": {"profiler": {"enable": True, "tool": "nsight"}}},
           "critic": {"profiler": {"enable": True, "tool_config": {"torch": {"contents": ["cuda", "flops"]}}}}}
    t = translate("verl", bad)
    assert [e.source for e in t.errors] == ["global_profiler.steps", "actor_rollout_ref.actor.profiler.tool",
                                            "critic.profiler.tool_config.torch.contents"]
    assert "step 0 never runs" in t.errors[0].message and "did you mean 'nsys'" in t.errors[1].message
    with pytest.raises(ValueError, match="3 problems") as e:
        ProfilerConfig.from_dialect("verl", bad)
    assert all(src in str(e.value) for src in ("global_profiler.steps", "profiler.tool", "contents"))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    code, out, _ = cli("validate", path, "--dialect", "verl", "--json")
    assert code == 2 and not out["valid"] and len(out["errors"]) == 3


def test_telemetry_or_hang_evidence_alone_is_not_called_capturing_nothing(tmp_path):
    for extra in ({"telemetry": True}, {"hang": {"enabled": True, "timeout_s": 60}}):
        t = translate("distprof", {"save_path": str(tmp_path), **extra})
        assert t.ok and not [w for w in t.warnings if "captures nothing" in w.message], extra
    assert "captures nothing" in translate("distprof", {"save_path": str(tmp_path)}).warnings[0].message


def test_a_config_that_captures_nothing_or_less_is_warned_about(tmp_path):
    inert = {"global_profiler": {"tool": "torch", "steps": [1, 2]},
             "actor_rollout_ref": {r: {"profiler": {"enable": False}} for r in ("actor", "ref", "rollout")},
             "critic": {"profiler": {"enable": False}}}
    path = tmp_path / "inert.yaml"
    path.write_text(yaml.safe_dump(inert))
    code, _, err = cli("validate", path, "--dialect", "verl")
    assert code == 1 and "captures nothing" in err and "no role's profiler is enabled" in err

    late = {"trainer": {"total_training_steps": 3, "nnodes": 1, "n_gpus_per_node": 2},
            "global_profiler": {"tool": "torch", "steps": [2, 5]},
            "actor_rollout_ref": {"actor": {"profiler": {"enable": True, "ranks": [1, 3]}}}}
    t = translate("verl", late)
    assert t.ok and [w.source for w in t.warnings] == ["trainer.total_training_steps",
                                                       "trainer.nnodes * trainer.n_gpus_per_node"]
    assert "steps 5 come after the job's last step 3" in t.warnings[0].message
    assert "ranks [3] do not exist in a job of 2 ranks" in t.warnings[1].message
    late["global_profiler"]["steps"] = [4, 5]
    assert "captures nothing" in translate("verl", late).warnings[0].message
    assert "steps is null" in translate("verl", {**late, "global_profiler": {"tool": "torch"}}).warnings[0].message
    t = translate("rlinf", {"cluster": {"profiling": {"backend": "nsight", "output_dir": "/p"}}})
    assert t.ok and "worker_groups is null" in t.warnings[0].message


# ---- RLinf ---------------------------------------------------------------------------------------------------
def test_rlinf_worker_groups_become_roles_with_nsight_options():
    t = translate("rlinf", load_file(fixture("rlinf_embodied.yaml")))
    assert t.ok and not t.warnings, (t.errors, t.warnings)
    pc = t.profiler_config
    assert (pc.backend, pc.roles, pc.ranks, pc.steps, pc.save_path) == (
        "nsys", ["ActorGroup", "RolloutGroup"], "all", [3, 4], "/mnt/profiles/ppo_openvla")
    assert pc.nsys.options == {"t": "cuda,cudnn,cublas,nvtx,osrt", "sample": "process-tree",
                               "cpuctxsw": "process-tree", "osrt-threshold": 1000}
    assert pc.nsys.flags == ["python-backtrace"]
    assert "records only the first listed step" in by_source(t)["cluster.profiling.options"].note
    amd = translate("rlinf", load_file(fixture("rlinf_rocprof.yaml"))).profiler_config
    assert (amd.backend, amd.roles, amd.whole_lifetime, amd.save_path) == (
        "rocprof_sys", ["ActorGroup"], True, "/work/results/grpo_amd/profiling")  # RLinf's default output_dir
    assert amd.rocprof_sys.options == {"T": "hip,hsa,rccl", "output-format": "json"}
    assert amd.rocprof_sys.env == {"ROCPROFSYS_SAMPLING_FREQ": "100"}
    bad = translate("rlinf", {"cluster": {"profiling": {
        "backend": "nsight", "worker_groups": ["ActorGroup"], "steps": [1, 5], "output_dir": "/p",
        "options": {"capture-range-end": "stop", "o": "x", "output": "y"}, "worker_group": "typo"}}})
    assert [e.source for e in bad.errors] == ["cluster.profiling.worker_group", "cluster.profiling.options"]
    assert "did you mean 'worker_groups'" in bad.errors[0].message


# ---- SkyRL, slime, torchtitan: their schedules, checked against torch.profiler.schedule ---------------------
def test_skyrl_policy_profiler_records_the_steps_skyrl_would():
    t = translate("skyrl", load_file(fixture("skyrl_grpo.yaml")))
    assert t.ok and not t.warnings, (t.errors, t.warnings)
    pc = t.profiler_config
    policy = pc.for_role("policy")
    assert (pc.roles, policy.ranks, policy.save_path) == (["policy"], [0, 1], "/home/ray/profiles/grpo")
    assert policy.torch.record_shapes and not policy.torch.with_stack  # SkyRL's default, and the override
    # SkyRL steps torch.profiler once per RL step from global step 1: the k-th step() call ends global step k+1.
    skyrl = [k + 1 for k in recorded_by_torch_schedule(40, skip_first=5, wait=0, warmup=1, active=2, repeat=2)]
    assert recorded_by_distprof(pc, "policy", 40) == skyrl == [7, 8, 10, 11]
    stacks = translate("skyrl", {"torch_profiler_config": {"enable": True, "save_path": "/p", "export_type": "stacks"}})
    assert stacks.profiler_config.torch.export_stacks and not stacks.profiler_config.torch.export_chrome_trace
    assert [e.source for e in translate("skyrl", {"torch_profiler_config": {
        "enable": True, "ranks": [], "activities": ["tpu"], "active": 0}}).errors] == [
        "torch_profiler_config.ranks", "torch_profiler_config.save_path", "torch_profiler_config.active",
        "torch_profiler_config.activities"]


def test_slime_flags_and_env_in_every_form():
    t = translate("slime", load_file(fixture("slime_args.yaml")), env={})
    assert t.ok and not t.warnings, (t.errors, t.warnings)
    pc = t.profiler_config
    assert (pc.roles, pc.steps, pc.ranks, pc.save_path) == (
        ["train_overall", "train_overall/memory"], [3, 4], [0], "/root/slime_tb")
    assert pc.torch.record_shapes and pc.torch.with_flops and pc.torch.profile_memory and not pc.torch.with_stack
    mem = pc.for_role("train_overall/memory")
    assert (mem.backend, mem.steps, mem.cuda_memory.stacks, mem.cuda_memory.max_entries) == (
        "cuda_memory", [0, 1], "all", 1_000_000)
    # The environment wins over the file, as at run time.
    assert translate("slime", load_file(fixture("slime_args.yaml")),
                     env={"SLIME_PROFILE_ALL_RANKS": "1"}).profiler_config.ranks == "all"

    line = ("--use-pytorch-profiler --profile-step-start 10 --profile-step-end 12 --tensorboard-dir /tmp/tb "
            "--profile-target train_overall train_actor --micro-batch-size 1")
    for form in (line, line.split(), argparse.Namespace(use_pytorch_profiler=True, profile_step_start=10,
                                                        profile_step_end=12, tensorboard_dir="/tmp/tb",
                                                        profile_target=["train_overall", "train_actor"])):
        t = translate("slime", form, env={})
        assert t.ok, t.errors
        assert (t.profiler_config.roles, t.profiler_config.ranks) == (["train_overall", "train_actor"], "all")
        # slime: schedule(wait=start-1, warmup=1, active=end-start), stepped once per rollout id from 0.
        assert t.profiler_config.steps == recorded_by_torch_schedule(30, wait=9, warmup=1, active=2, repeat=1)
        assert "no caller" in next(m.note for m in t.mapping if m.value == "train_actor")
    bad = translate("slime", ["--use-pytorch-profiler", "--profile-step-start", "5", "--profile-step-end", "5"], env={})
    assert [e.source for e in bad.errors] == ["--profile-step-end", "--tensorboard-dir"]


def test_torchtitan_periodic_capture_and_memory_snapshots():
    t = translate("torchtitan", load_file(fixture("torchtitan_llama3.toml")))
    assert t.ok and not t.warnings, (t.errors, t.warnings)
    pc = t.profiler_config
    assert (pc.ranks, pc.save_path, pc.torch.record_shapes) == ("all", "./outputs/profile_trace", True)
    # torchtitan's step s runs under torch schedule step s-1 (step_num starts at the resumed step, 0).
    titan = [k + 1 for k in recorded_by_torch_schedule(400, wait=95, warmup=3, active=2)]
    assert recorded_by_distprof(pc, "main", 400) == titan == [99, 100, 199, 200, 299, 300, 399, 400]
    mem = pc.for_role("memory")
    assert (mem.backend, mem.cuda_memory.stacks, mem.cuda_memory.max_entries) == ("cuda_memory", "python", 1_000_000)
    assert [w.end for w in (mem.plan().next_window(s) for s in (0, 101, 201))] == [100, 200, 300]  # a snapshot per 100
    assert [d.source for d in t.dropped] == ["profiling.save_memory_snapshot_folder"]
    bad = translate("torchtitan", {"profiling": {"enable_profiling": True, "profile_freq": 3, "profiler_warmup": 3}})
    assert bad.errors[0].source == "profiling.profile_freq" and "profiler_warmup + profiler_active" in str(bad.errors[0])


# ---- ms-swift, NeMo-RL -------------------------------------------------------------------------------------------
def test_swift_profiler_arguments():
    t = translate("swift", load_file(fixture("swift_sft.yaml")))
    assert t.ok and not t.warnings, (t.errors, t.warnings)
    pc = t.profiler_config
    assert (pc.steps, pc.ranks, pc.save_path, pc.roles) == ([1, 2], [0, 1], "./profiler_output", None)
    assert pc.torch.activities == ["cpu", "cuda"] and pc.torch.with_stack and not pc.torch.record_shapes
    cmd = "--enable_profiler true --profiler_save_path /p --profiler_all_ranks true --profiler_contents cpu shape " \
          "--profiler_steps 0 1 --max_steps 1"
    t = translate("swift", cmd)
    assert (t.profiler_config.ranks, t.profiler_config.torch.record_shapes) == ("all", True)
    assert "steps 1 come after the job's last step 0" in t.warnings[0].message
    bad = translate("swift", {"enable_profiler": True, "profiler_contents": ["gpu"]})
    assert [e.source for e in bad.errors] == ["--profiler_save_path", "--profiler_steps", "--profiler_ranks",
                                              "--profiler_contents"]


def test_nemo_rl_env_variables_with_their_stop_exclusive_range():
    t = translate("nemo_rl", load_file(fixture("nemo_rl_env.yaml")), env={})
    assert t.ok and not t.warnings, (t.errors, t.warnings)
    pc = t.profiler_config
    assert (pc.backend, pc.roles, pc.steps, pc.ranks) == ("nsys", ["*policy*", "*vllm*"], [2, 3], "all")
    assert pc.nsys.options["t"] == "cuda,nvtx" and pc.nsys.options["gpu-metrics-device"] == "all"
    assert "o" not in pc.nsys.options and [d.source for d in t.dropped] == ["NeMo-RL default o"]
    assert "stop is exclusive" in by_source(t)["NRL_NSYS_PROFILE_STEP_RANGE"].note
    over = translate("nemo_rl", load_file(fixture("nemo_rl_env.yaml")), env={"NRL_NSYS_PROFILE_STEP_RANGE": "5:8"})
    assert over.profiler_config.steps == [5, 6, 7]  # the environment wins over the file
    assert translate("nemo_rl", {}, env={}).warnings[0].message.endswith("are not set")
    for rng, why in (("3:3", "empty"), ("0:2", "from 1"), ("x", "start:stop")):
        t = translate("nemo_rl", {"save_path": "/p"}, env={"NRL_NSYS_WORKER_PATTERNS": "*", "NRL_NSYS_PROFILE_STEP_RANGE": rng})
        assert why in t.errors[0].message
    assert "set together" in translate("nemo_rl", {}, env={"NRL_NSYS_WORKER_PATTERNS": "*"}).errors[0].message


# ---- the validate command on untrusted input --------------------------------------------------------------------
def test_validate_refuses_unreadable_files_in_one_line(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f'{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n' for p, c in zip("abcdefgh", "bcdefghi")))
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("global_profiler: !!python/object/apply:os.system ['echo hi']\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("global_profiler: [1, 2\n")
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"# " + b"x" * (5 << 20))
    for path in (tmp_path / "missing.yaml", tmp_path, broken, bomb, tagged, huge):
        code, out, err = cli("validate", path, "--dialect", "verl")
        assert code == 2 and out == "", (path, err)
        assert len(err.strip().splitlines()) == 1 and str(path) in err and "Traceback" not in err, err
    code, out, _ = cli("validate", broken, "--dialect", "verl", "--json")
    assert code == 2 and out["errors"][0]["source"] == str(broken)
    # Values that would be built big are refused before they are: ranges, and interpolations copying subtrees.
    t = translate("slime", ["--use-pytorch-profiler", "--profile-step-end", str(10**12), "--tensorboard-dir", "/t"])
    assert "more than the 1,000,000 a step list may hold" in t.errors[0].message
    t = translate("nemo_rl", {"save_path": "/p"}, env={"NRL_NSYS_WORKER_PATTERNS": "*",
                                                       "NRL_NSYS_PROFILE_STEP_RANGE": f"1:{10**30}"})
    assert "start:stop with whole numbers" in t.errors[0].message
    bomb = {"a": ["x"] * 100, **{f"l{i}": [f"${{l{i - 1}}}" if i else "${a}"] * 100 for i in range(5)}}
    with pytest.raises(ValueError, match="interpolations expand it past"):
        translate("verl", bomb)


def test_validate_a_distprof_config_and_point_at_the_dialect(tmp_path):
    native = tmp_path / "distprof.yaml"
    native.write_text("distprof:\n  enable: true\n  save_path: /tmp/p\n  steps: 3,5-6\n  ranks: all\n")
    code, out, _ = cli("validate", native, "--json")
    assert code == 0 and out["dialect"] == "distprof" and out["config"]["steps"] == [3, 5, 6]
    code, out, err = cli("validate", fixture("verl_ppo_torch.yaml"))
    assert code == 2 and "--dialect verl" in err
    code, _, err = cli("validate", fixture("verl_ppo_torch.yaml"), "--dialect", "veRL-x")
    assert code == 2 and "dialect 'veRL-x' is unknown" in err and "Did you mean 'verl'" in err
    code, out, _ = cli("validate", fixture("skyrl_grpo.yaml"), "--dialect", "skyrl",
                       "--section", "trainer.policy.torch_profiler_config", "--json")
    assert code == 0 and out["config"]["ranks"] == [0, 1]


def test_hostile_files_end_in_one_line(tmp_path):
    """Interpolations that build huge strings, nesting deeper than Python's parsers go, and thousands of unknown
    keys: one readable line, exit 2, quickly (the string bomb once reached 13 GB)."""
    bomb = ["a: " + "x" * 1000] + [f"l{i}: ${{l{i - 1}}}${{l{i - 1}}}" if i else "l0: ${a}${a}" for i in range(30)]
    (tmp_path / "strbomb.yaml").write_text("\n".join(bomb) + "\n")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "many.yaml").write_text("\n".join(f"k{i}: {i}" for i in range(3000)))
    for name, dialect, expect in (("strbomb.yaml", "verl", "interpolations build strings past"),
                                  ("deep.json", "verl", "nests too deep"),
                                  ("many.yaml", None, "more fields not checked")):
        args = ["validate", tmp_path / name] + (["--dialect", dialect] if dialect else [])
        code, out, err = cli(*args)
        assert code == 2 and expect in (out + err), (name, out[-500:], err[-500:])
        assert "Traceback" not in err
