"""ProfilerConfig: defaults, every refused setting, and every way to load it."""

import pytest

from distprof import ProfilerConfig


def test_conservative_defaults():
    c = ProfilerConfig()
    assert c.enable is False and c.backend == "torch" and c.ranks == [0] and c.roles is None
    t = c.torch
    assert not (t.record_shapes or t.profile_memory or t.with_stack or t.with_flops or t.with_modules)
    assert t.gzip is True and t.activities == ["auto"]  # cpu + the accelerator present, resolved per window
    assert c.on_error == "disable"


def test_enabled_without_steps_uses_default_schedule():
    c = ProfilerConfig(enable=True, save_path="x")
    assert [(w.start, w.end) for w in c.plan().windows_until(100)] == [(11, 12)]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(enable=True), ["save_path", "None", "set save_path"]),
        (dict(enable=True, save_path=""), ["save_path", "''"]),
        (dict(steps=[-1]), ["steps", "-1", "negative"]),
        (dict(steps=[2.5]), ["steps", "2.5", "whole numbers"]),
        (dict(steps=["x"]), ["steps", "'x'"]),
        (dict(steps=[True]), ["steps", "True"]),
        (dict(steps=[]), ["steps is empty"]),
        (dict(steps="9-3"), ["9-3", "START <= END"]),
        (dict(steps=[3], schedule={"active": 1}), ["steps", "schedule", "exclusive"]),
        (dict(ranks=[-2]), ["ranks", "-2"]),
        (dict(ranks=[0.5]), ["ranks", "0.5"]),
        (dict(ranks=[]), ["ranks is empty"]),
        (dict(ranks="some"), ["ranks", "'some'"]),
        (dict(schedule={"active": 0}), ["schedule.active", "0"]),
        (dict(schedule={"wait": -1}), ["schedule.wait", "-1"]),
        (dict(schedule={"warmup": None}), ["schedule.warmup", "null"]),
        (dict(schedule={"repeat": "x"}), ["schedule.repeat", "'x'"]),
        (dict(schedule={"actve": 1}), ["actve", "'active'"]),
        (dict(torch={"activities": []}), ["torch.activities", "non-empty"]),
        (dict(torch={"activities": None}), ["torch.activities", "null"]),
        (dict(torch={"activities": ["gpu"]}), ["torch.activities", "'gpu'", "cpu, cuda"]),
        (dict(torch={"export_stacks": True}), ["export_stacks", "with_stack"]),
        (dict(torch={"record_shape": True}), ["record_shape", "'record_shapes'"]),
        (dict(backend="nsight"), ["backend", "'nsight'", "nsys"]),
        (dict(on_error="ignore"), ["on_error", "'ignore'", "disable"]),
        (dict(enabled=True), ["enabled=True: unknown setting; did you mean 'enable'?"]),
        (dict(roles=[""]), ["roles", "empty"]),
        (dict(roles=["../etc"]), ["roles", "'../etc'", "outside save_path"]),
        (dict(roles=["/abs"]), ["roles", "'/abs'"]),
        (dict(roles=[]), ["roles", "non-empty"]),
    ],
)
def test_bad_settings_name_field_value_and_fix(kwargs, words):
    with pytest.raises(ValueError) as e:
        ProfilerConfig(**kwargs)
    msg = str(e.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_ranks_beyond_world_size_refused():
    c = ProfilerConfig(ranks=[0, 4])
    c.check_world_size(8)
    with pytest.raises(ValueError, match=r"ranks \[4\] do not exist: world size is 2"):
        c.check_world_size(2)
    ProfilerConfig(ranks="all").check_world_size(1)


def test_steps_forms():
    assert ProfilerConfig(steps=[10, 3, 3]).steps == [3, 10]
    assert ProfilerConfig(steps="3,10,20-22").steps == [3, 10, 20, 21, 22]
    assert ProfilerConfig(steps=["5-6", 9]).steps == [5, 6, 9]
    assert ProfilerConfig(steps=7).steps == [7]


def test_env_overrides_win(monkeypatch):
    monkeypatch.setenv("DISTPROF_ENABLE", "1")
    monkeypatch.setenv("DISTPROF_RANKS", "all")
    monkeypatch.setenv("DISTPROF_STEPS", "3,10")
    monkeypatch.setenv("DISTPROF_SAVE_PATH", "/tmp/p")
    monkeypatch.setenv("DISTPROF_TORCH_RECORD_SHAPES", "true")
    monkeypatch.setenv("DISTPROF_ROLES", "actor,rollout")
    c = ProfilerConfig.from_dict({"enable": False, "ranks": [0], "save_path": "elsewhere"})
    assert (c.enable, c.ranks, c.steps, c.save_path) == (True, "all", [3, 10], "/tmp/p")
    assert c.torch.record_shapes is True and c.roles == ["actor", "rollout"]


def test_env_schedule_fields(monkeypatch):
    monkeypatch.setenv("DISTPROF_SCHEDULE_ACTIVE", "3")
    c = ProfilerConfig(schedule={"skip_first": 2})
    assert (c.schedule.skip_first, c.schedule.active) == (2, 3)


def test_env_typo_refused(monkeypatch):
    monkeypatch.setenv("DISTPROF_ENABLED", "1")
    with pytest.raises(ValueError, match=r"^DISTPROF_ENABLED=1: not a distprof setting; did you mean 'DISTPROF_ENABLE'\?$"):
        ProfilerConfig()


def test_env_bad_value_names_field(monkeypatch):
    monkeypatch.setenv("DISTPROF_STEPS", "-4")
    with pytest.raises(ValueError, match="steps"):
        ProfilerConfig()


def test_yaml_whole_file_top_section_and_nested(tmp_path):
    (tmp_path / "a.yaml").write_text("enable: true\nsave_path: out\nsteps: [3, 4]\n")
    (tmp_path / "b.yaml").write_text("model: {layers: 2}\ndistprof:\n  enable: true\n  save_path: out\n  ranks: all\n")
    (tmp_path / "c.yaml").write_text("actor_rollout_ref:\n  actor:\n    profiler:\n      enable: true\n      save_path: o\n      torch: {with_stack: true}\n")
    assert ProfilerConfig.from_yaml(tmp_path / "a.yaml").steps == [3, 4]
    assert ProfilerConfig.from_yaml(tmp_path / "b.yaml").ranks == "all"
    c = ProfilerConfig.from_yaml(tmp_path / "c.yaml", section="actor_rollout_ref.actor.profiler")
    assert c.torch.with_stack is True
    with pytest.raises(ValueError, match="section 'actor.nope' not found"):
        ProfilerConfig.from_yaml(tmp_path / "c.yaml", section="actor.nope")


def test_yaml_typo_refused(tmp_path):
    (tmp_path / "t.yaml").write_text("enabled: true\n")
    with pytest.raises(ValueError, match=r"^enabled=True: unknown setting; did you mean 'enable'\?$"):
        ProfilerConfig.from_yaml(tmp_path / "t.yaml")


def test_omegaconf():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {"profiler": {"enable": True, "save_path": "${oc.env:HOME}/p", "steps": [1]}}})
    c = ProfilerConfig.from_dict(cfg, section="trainer.profiler")
    assert c.enable and c.save_path.endswith("/p") and "${" not in c.save_path
    c2 = ProfilerConfig.from_dict(cfg.trainer.profiler)
    assert c2.steps == [1]


def test_config_is_frozen_and_round_trips():
    c = ProfilerConfig(enable=True, save_path="s", steps=[1, 2], roles=["actor"])
    with pytest.raises(Exception):
        c.enable = False
    assert ProfilerConfig.from_dict(c.model_dump()) == c
    import pickle

    assert pickle.loads(pickle.dumps(c)) == c


# ---- activities that fit the machine (no GPU here: torch reports none) ------------------------------------------

def test_activities_auto_forms_and_mixes():
    assert ProfilerConfig(torch={"activities": "auto"}).torch.activities == ["auto"]
    assert ProfilerConfig(torch={"activities": "CPU, cuda"}).torch.activities == ["cpu", "cuda"]
    with pytest.raises(ValueError, match="mixes 'auto' with named activities"):
        ProfilerConfig(torch={"activities": ["auto", "cpu"]})


def test_resolve_activities_for_each_machine():
    from distprof.capture.backends.torch_backend import resolve_activities

    assert resolve_activities(["auto"], []) == ["cpu"]
    assert resolve_activities(["auto"], ["cuda"]) == ["cpu", "cuda"]  # NVIDIA, or ROCm (torch.cuda with HIP)
    assert resolve_activities(["auto"], ["xpu"]) == ["cpu", "xpu"]
    assert resolve_activities(["cuda"], ["cuda"]) == ["cuda"]  # explicit choices are kept as given
    assert resolve_activities(["cpu", "xpu"], ["cuda"]) == ["cpu"]


def _windows_and_warnings(tmp_path, caplog, monkeypatch, activities):
    import logging

    from conftest import load_trace, trace_files
    from helpers import run

    from distprof import Profiler
    from distprof.capture.backends import torch_backend

    monkeypatch.setattr(torch_backend, "_warned_missing", set())  # a fresh process's state
    torch_opts = {} if activities is None else {"activities": activities}
    config = ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[1, 4], torch=torch_opts)
    with caplog.at_level(logging.WARNING, logger="distprof"):
        run(Profiler(config), 6)
    files = trace_files(tmp_path / "run")
    assert len(files) == 2
    recorded = [load_trace(f)["distprof"]["activities"] for f in files]  # the trace says what "auto" became
    return recorded, [r.getMessage() for r in caplog.records if "activity requested" in r.getMessage()]


def test_default_activities_record_cpu_without_a_warning(tmp_path, caplog, monkeypatch):
    import torch

    from distprof.capture.backends.torch_backend import accelerators_present

    assert accelerators_present(torch) == []  # this machine: CPU only
    recorded, warnings = _windows_and_warnings(tmp_path, caplog, monkeypatch, None)
    assert recorded == [["cpu"], ["cpu"]] and warnings == []


def test_explicit_cuda_without_cuda_warns_once(tmp_path, caplog, monkeypatch):
    recorded, warnings = _windows_and_warnings(tmp_path, caplog, monkeypatch, ["cpu", "cuda"])
    assert recorded == [["cpu"], ["cpu"]]
    assert warnings == ["distprof: CUDA activity requested but CUDA is not available; capturing CPU only"]


def test_environment_steps_replace_a_files_schedule(monkeypatch):
    """DISTPROF_* wins over the file: explicit steps replace its schedule (as --profile-steps does), and
    DISTPROF_SCHEDULE=null removes it."""
    monkeypatch.setenv("DISTPROF_STEPS", "5")
    c = ProfilerConfig.from_dict({"schedule": {"active": 2}})
    assert c.steps == [5] and c.schedule is None
    monkeypatch.delenv("DISTPROF_STEPS")
    monkeypatch.setenv("DISTPROF_SCHEDULE", "null")
    assert ProfilerConfig.from_dict({"schedule": {"active": 2}}).schedule is None
    monkeypatch.setenv("DISTPROF_SCHEDULE", "weekly")
    with pytest.raises(ValueError, match="DISTPROF_SCHEDULE=weekly: only null is accepted"):
        ProfilerConfig.from_dict({})


@pytest.mark.parametrize("kw, message", [
    (dict(torch={"summary_top": -5}), "summary_top must be >= 1"),
    (dict(torch={"post_processing_timeout_s": float("nan")}), "finite number of seconds"),
    (dict(py_spy={"rate": 0}), "py_spy.rate must be between 1 and 10000"),
    (dict(nsys={"finalize_timeout_s": float("inf")}), "finite number of seconds"),
    (dict(nsys={"executable": "nsys\n--evil"}), "without control characters"),
    (dict(cuda_memory={"max_entries": 10**30}), "between 1 and 100,000,000"),
])
def test_numeric_and_command_settings_are_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        ProfilerConfig(**kw)
