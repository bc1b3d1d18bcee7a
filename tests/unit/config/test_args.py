"""Command-line flags: distprof.add_profiler_args for argparse, ProfilerArguments for HfArgumentParser, and
ProfilerConfig.from_args with its precedence (defaults < base < --profile-config file < flags < DISTPROF_*)."""

import argparse
import subprocess
import sys

import pytest

import distprof
from distprof import ProfilerConfig
from distprof.config.args import ProfilerArguments
from distprof.config.model import ConfigError


def parse(argv, **kw):
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    distprof.add_profiler_args(parser, **kw)
    return parser.parse_args(argv)


def test_every_flag_reaches_the_config(tmp_path):
    ns = parse(["--profile", "--profile-steps", "3,10-12", "--profile-ranks", "0,8", "--profile-roles", "actor,rollout",
                "--profile-save-path", str(tmp_path / "p"), "--profile-backend", "cuda_memory", "--lr", "0.5"])
    c = ProfilerConfig.from_args(ns)
    assert (c.enable, c.steps, c.ranks, c.roles) == (True, [3, 10, 11, 12], [0, 8], ["actor", "rollout"])
    assert (c.save_path, c.backend) == (str(tmp_path / "p"), "cuda_memory") and ns.lr == 0.5


def test_no_flags_give_the_defaults():
    assert ProfilerConfig.from_args(parse([])) == ProfilerConfig()


def test_flags_override_the_file_and_leave_the_rest(tmp_path):
    f = tmp_path / "prof.yaml"
    f.write_text("model: {layers: 2}\ndistprof:\n  enable: true\n  save_path: from-file\n  ranks: all\n"
                 "  schedule: {skip_first: 4, active: 2}\n  torch: {record_shapes: true}\n")
    c = ProfilerConfig.from_args(parse(["--profile-config", str(f)]))
    assert (c.save_path, c.ranks, c.schedule.skip_first, c.torch.record_shapes) == ("from-file", "all", 4, True)
    c = ProfilerConfig.from_args(parse(["--profile-config", str(f), "--profile-steps", "7", "--profile-ranks", "1"]))
    assert (c.steps, c.schedule, c.ranks) == ([7], None, [1])  # steps replace the file's schedule
    assert (c.enable, c.save_path, c.torch.record_shapes) == (True, "from-file", True)
    c = ProfilerConfig.from_args(parse(["--profile-config", str(f), "--no-profile"]))
    assert c.enable is False and c.ranks == "all"


def test_precedence_base_file_flags_environment(tmp_path, monkeypatch):
    f = tmp_path / "prof.yaml"
    f.write_text("roles: [actor]\nranks: [1]\n")
    base = ProfilerConfig(save_path="base", ranks=[0], steps=[1], torch={"with_stack": True})
    ns = parse(["--profile-config", str(f), "--profile-steps", "5", "--profile"])
    c = ProfilerConfig.from_args(ns, base=base)
    assert (c.save_path, c.torch.with_stack) == ("base", True)  # base, untouched by file or flags
    assert (c.roles, c.ranks) == (["actor"], [1])  # the file over the base
    assert (c.steps, c.enable) == ([5], True)  # flags over both
    monkeypatch.setenv("DISTPROF_STEPS", "9")
    monkeypatch.setenv("DISTPROF_RANKS", "all")
    c = ProfilerConfig.from_args(ns, base=base)
    assert (c.steps, c.ranks, c.roles) == ([9], "all", ["actor"])  # the environment wins over flags
    assert base.steps == [1]


@pytest.mark.parametrize("argv, start", [
    (["--profile-steps", "x"], "--profile-steps x: steps must hold whole numbers, got 'x'"),
    (["--profile-steps", "1-1000000000"], "--profile-steps 1-1000000000: steps '1-1000000000' brings"),
    (["--profile-ranks", "some"], "--profile-ranks some: ranks must hold whole numbers"),
    (["--profile-roles", "../up"], "--profile-roles ../up: roles role '../up' would write outside save_path"),
    (["--profile-backend", "nsight"], "--profile-backend nsight: backend 'nsight' is unknown"),
    (["--profile-save-path", "a\x00b"], "--profile-save-path 'a\\x00b': save_path"),
    (["--profile"], "save_path is None but enable=True"),
])
def test_flag_errors_name_the_flag(argv, start):
    with pytest.raises(ConfigError) as e:
        ProfilerConfig.from_args(parse(argv))
    assert str(e.value).startswith(start), str(e.value)


def test_config_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("enable: true\nsave_path: !!python/name:os.system\n")
    with pytest.raises(ConfigError, match=rf"^{bad}:2: .*safe loader"):
        ProfilerConfig.from_args(parse(["--profile-config", str(bad)]))
    with pytest.raises(ConfigError, match="missing.yaml: cannot read the config file"):
        ProfilerConfig.from_args(parse(["--profile-config", str(tmp_path / "missing.yaml")]))


def test_prefix_and_group_avoid_a_clash_with_the_scripts_own_flag():
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", action="store_true", help="the script's own profiling")
    distprof.add_profiler_args(parser, group_name="distprof", prefix="dp")
    ns = parser.parse_args(["--profile", "--dp", "--dp-steps", "2", "--dp-save-path", "out"])
    assert ns.profile is True
    c = ProfilerConfig.from_args(ns)  # the prefix is found on the namespace
    assert (c.enable, c.steps, c.save_path) == (True, [2], "out")
    assert any(g.title == "distprof" for g in parser._action_groups)
    with pytest.raises(ValueError, match="prefix='--x' is not a flag name"):
        distprof.add_profiler_args(argparse.ArgumentParser(), prefix="--x")
    with pytest.raises(ValueError, match="holds none of the --profile"):
        ProfilerConfig.from_args(argparse.Namespace(lr=1))


def test_hf_argument_parser_with_profiler_arguments(tmp_path):
    from transformers import HfArgumentParser

    parser = HfArgumentParser((ProfilerArguments,))
    assert "global steps to capture" in parser.format_help()
    (args,) = parser.parse_args_into_dataclasses(["--profile", "--profile-steps", "3,10-12", "--profile_ranks", "all",
                                                  "--profile-save-path", str(tmp_path)])
    c = ProfilerConfig.from_args(args)
    assert (c.enable, c.steps, c.ranks, c.save_path) == (True, [3, 10, 11, 12], "all", str(tmp_path))
    (args,) = parser.parse_args_into_dataclasses(["--profile", "false"])
    assert ProfilerConfig.from_args(args, base={"enable": True, "save_path": "x"}).enable is False
    (args,) = parser.parse_args_into_dataclasses([])
    assert ProfilerConfig.from_args(args, base={"enable": True, "save_path": "x"}).enable is True  # not given
    (args,) = parser.parse_args_into_dataclasses(["--profile-steps", "y"])
    with pytest.raises(ConfigError, match="^--profile-steps y: steps"):
        ProfilerConfig.from_args(args)


def test_import_distprof_stays_light():
    code = ("import sys, distprof; assert 'pydantic' not in sys.modules, 'pydantic at import';"
            "assert 'add_profiler_args' in distprof.__all__; distprof.add_profiler_args; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_readme_flags_example(tmp_path, monkeypatch):
    """The README's argparse block, as printed (run from a scratch directory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py", "--profile", "--profile-steps", "3,10-12", "--profile-ranks", "all",
                                      "--profile-save-path", "runs/exp1/profile"])
    import argparse

    import distprof

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-4)
    distprof.add_profiler_args(parser)  # --profile, --profile-steps, --profile-ranks, --profile-roles, ...
    args = parser.parse_args()
    config = distprof.ProfilerConfig.from_args(args)  # DISTPROF_* variables still win over flags
    assert config.steps == [3, 10, 11, 12] and config.ranks == "all" and config.enable
