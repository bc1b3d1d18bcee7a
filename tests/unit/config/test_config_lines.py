"""Config problems read as one line each (issue 18, item 11): where (the dotted field, or the DISTPROF_* variable or
flag the value came from) and the value, what is wrong, the suggestion first; never a list of every setting, never
the same problem twice. Every loader raises one ConfigError listing every problem, nested sections and several
sections included, and a dialect lists every key it drops instead of ignoring it."""

import argparse
import logging
import os
import pickle
import re

import pytest
import yaml
from conftest import REPO
from tracekit import cli

import distprof
from distprof import ProfilerConfig
from distprof.config.dialects import load_file
from distprof.config.dialects import translate as _translate
from distprof.config.model import ProfilerConfig as _ProfilerConfig


def translate(*args, **kwargs):  # the dialects are given the config class they validate with
    return _translate(*args, config=_ProfilerConfig, **kwargs)
from distprof.config.model import ConfigError, ConfigProblem

README = os.path.join(REPO, "README.md")
CAPTURE_DOC = os.path.join(REPO, "docs", "capture.md")  # the from_args example


def refused(fn) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        fn()
    return e.value


def lines(e: ConfigError) -> list[str]:
    return str(e).splitlines()


def parse(argv):
    return distprof.add_profiler_args(argparse.ArgumentParser()).parse_args(argv)


# ---- one line per problem ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, line", [
    (dict(enabled=True), "enabled=True: unknown setting; did you mean 'enable'?"),
    (dict(torch={"with_stak": True}), "torch.with_stak=True: unknown setting; did you mean 'with_stack'?"),
    (dict(schedule={"zzz": 1}), "schedule.zzz=1: unknown setting; schedule takes skip_first, wait, warmup, active, "
                                "repeat"),
    ({"zzz": 1}, "zzz=1: unknown setting; see the Configuration table in the README"),
    (dict(backend="torhc"), "backend 'torhc' is unknown; did you mean 'torch'? choose one of torch, cuda_memory, nsys, "
                            "rocprof_sys, py_spy, memray"),
])
def test_an_unknown_name_is_one_line_with_the_suggestion_first_and_no_list_of_every_setting(kwargs, line):
    e = refused(lambda: ProfilerConfig(**kwargs))
    assert lines(e) == [line]
    assert "trigger_max_steps" not in str(e)  # today: all 23 settings before the suggestion


def test_the_readme_has_the_table_the_messages_point_to():
    with open(README) as f:
        text = f.read()
    assert "### Configuration" in text and "| `on_error` |" in text


def test_a_nested_typo_is_named_by_its_dotted_path_in_errors_and_in_validate(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("enabel: true\ntorch: {record_shape: true}\nper_role:\n  actor:\n    torch: {record_shape: true}\n")
    expected = {
        "enabel": "enabel=True: unknown setting; did you mean 'enable'?",
        "torch.record_shape": "torch.record_shape=True: unknown setting; did you mean 'record_shapes'?",
        "per_role.actor.torch.record_shape": "per_role.actor.torch.record_shape=True: unknown setting; did you mean "
                                             "'record_shapes'?",
    }
    e = refused(lambda: ProfilerConfig.from_yaml(path))
    assert {p.field: p.message for p in e.problems} == expected and sorted(lines(e)) == sorted(expected.values())

    code, out, err = cli("validate", path)
    assert code == 2
    shown = [line.removeprefix("error: ") for line in err.splitlines() if line.startswith("error: ")]
    assert sorted(shown) == sorted(expected.values()), err  # today: "torch = true: ...", "per_role = true: ..."
    assert "invalid: 3 errors" in out


def test_a_bad_environment_variable_is_one_problem_with_its_own_value(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("enable: true\nsave_path: out\nsteps: [3]\nper_role:\n  actor: {ranks: all}\n"
                    "  rollout: {enable: false}\n")
    monkeypatch.setenv("DISTPROF_ENABLE", "2")
    line = "DISTPROF_ENABLE=2: expected 0/1/true/false"
    assert refused(lambda: ProfilerConfig.from_yaml(path)).problems == [ConfigProblem("enable", "'2'", line)]

    t = translate("distprof", load_file(path))
    assert [(p.source, p.value, str(p)) for p in t.errors] == [("DISTPROF_ENABLE", "2", line)]
    verl = {"global_profiler": {"tool": "torch", "steps": [1], "save_path": "out"},
            "critic": {"profiler": {"enable": True}}}
    assert [str(p) for p in translate("verl", verl, env={}).errors] == [line]

    code, out, _ = cli("validate", path, "--json")  # today: three errors, two of them "enable = true"
    assert code == 2 and [(p["source"], p["value"], p["text"]) for p in out["errors"]] == [("DISTPROF_ENABLE", "2", line)]


def test_a_config_recorded_in_run_json_applies_no_environment_variable(monkeypatch):
    monkeypatch.setenv("DISTPROF_ENABLE", "2")  # today the recorded config is refused, or changed, by the reader's env
    monkeypatch.setenv("DISTPROF_STEPS", "7")
    c = ProfilerConfig.from_saved({"steps": [3], "per_role": {"actor": {"ranks": "all"}}})
    assert (c.enable, c.steps, c.per_role) == (False, [3], {"actor": {"ranks": "all"}})


# ---- every problem at once, from every loader ----------------------------------------------------------------
BAD = {"enabel": True, "backend": "nsight", "torch": {"record_shape": True, "summary_top": 0},
       "schedule": {"actve": 1}, "per_role": {"actor": {"rank": 0, "torch": {"gzip": "sometimes"}},
                                              "rollout": {"steps": "x"}}}
FIELDS = {"enabel", "backend", "torch.record_shape", "torch.summary_top", "schedule.actve", "per_role.actor.rank",
          "per_role.actor.torch.gzip", "per_role.rollout.steps", "DISTPROF_ENABLD"}


def check_all_listed(e: ConfigError, fields: set[str]) -> None:
    assert {p.field for p in e.problems} == fields
    assert lines(e) == [p.message for p in e.problems]  # every one spelled out (today: 4, then "... and N more")
    for p in e.problems:  # each line starts with where: the dotted field, or the variable / flag
        assert p.message.startswith(p.field) or re.match(r"--profile-\w+ ", p.message), p


def test_every_loader_raises_one_config_error_listing_every_problem(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.setenv("DISTPROF_ENABLD", "1")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"distprof": BAD}))
    check_all_listed(refused(lambda: ProfilerConfig.from_dict(BAD)), FIELDS)
    check_all_listed(refused(lambda: ProfilerConfig.from_dict(OmegaConf.create(BAD))), FIELDS)
    check_all_listed(refused(lambda: ProfilerConfig.from_yaml(path)), FIELDS)  # today: the first problem only
    e = refused(lambda: ProfilerConfig.from_args(parse(["--profile-config", str(path), "--profile-ranks", "y"])))
    check_all_listed(e, FIELDS | {"ranks"})
    assert any(line.startswith("--profile-ranks y: ranks must hold whole numbers, got 'y'") for line in lines(e))
    assert lines(e)[0] == "DISTPROF_ENABLD=1: not a distprof setting; did you mean 'DISTPROF_ENABLE'?"

    monkeypatch.delenv("DISTPROF_ENABLD")
    verl = {"global_profiler": {"tool": "torch", "steps": [0, 2]},
            "actor_rollout_ref": {"actor": {"profiler": {"enable": True, "tool": "nsight"}}},
            "critic": {"profiler": {"enable": True, "tool_config": {"torch": {"contents": ["cuda", "flops"]}}}}}
    e = refused(lambda: ProfilerConfig.from_dialect("verl", verl))  # today a plain ValueError
    assert [p.field for p in e.problems] == ["global_profiler.steps", "actor_rollout_ref.actor.profiler.tool",
                                             "critic.profiler.tool_config.torch.contents"]
    assert lines(e)[0] == "verl config has 3 problems:" and lines(e)[1:] == [p.message for p in e.problems]
    assert lines(e)[2].startswith("actor_rollout_ref.actor.profiler.tool = \"nsight\": role actor: unknown tool; "
                                  "did you mean 'nsys'? use one of")
    again = pickle.loads(pickle.dumps(e))  # a Ray worker's error reaches the driver pickled
    assert type(again) is ConfigError and str(again) == str(e) and again.problems == e.problems


def test_keys_that_are_not_strings_are_config_errors(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("5: 1\ntorch: {7: x}\n")
    e = refused(lambda: ProfilerConfig.from_yaml(path))  # today: TypeError: keywords must be strings
    assert sorted(lines(e)) == ["5: setting names are strings, got 5; see the Configuration table in the README",
                                "torch.7: setting names are strings, got 7; see the Configuration table in the README"]
    assert not translate("distprof", load_file(path)).ok


def test_a_valid_trigger_config_validates():
    t = translate("distprof", {"trigger": True, "save_path": "runs/x"})  # today: "save_path is None but trigger"
    assert t.ok and t.errors == []


def test_the_readme_example_is_what_from_args_raises(tmp_path, monkeypatch):
    with open(CAPTURE_DOC) as f:
        text = f.read()
    block = re.search(r"`ProfilerConfig\.from_args` raises:\n\n```\n(.*?)```", text, re.S).group(1)
    path = tmp_path / "bad.yaml"
    path.write_text("enabel: true\nper_role: {actor: {ranks: x, torch: {record_shape: true}}}\n")
    monkeypatch.setenv("DISTPROF_ENABLE", "2")
    e = refused(lambda: ProfilerConfig.from_args(parse(["--profile-steps", "x", "--profile-config", str(path)])))
    assert str(e) + "\n" == block


# ---- dialects list what they drop --------------------------------------------------------------------------
VERL = {
    "global_profiler": {"tool": "torch", "steps": [1, 2], "save_path": "out", "stpes": [3]},
    "actor_rollout_ref": {"actor": {"profiler": {
        "enable": True, "tool_config": {"torch": {"contents": ["cuda"], "contnets": ["shapes"], "step_start": 3},
                                        "torhc": {}}}}},
    "critic": {"profiler": {"enable": False, "tool_confg": {}}},
}
VERL_UNKNOWN = {
    "global_profiler.stpes": "'steps'",
    "actor_rollout_ref.actor.profiler.tool_config.torch.contnets": "'contents'",
    "actor_rollout_ref.actor.profiler.tool_config.torhc": "'torch'",
    "critic.profiler.tool_confg": "'tool_config'",
}


def test_verl_lists_every_key_it_drops_and_from_dialect_warns_of_each(tmp_path, caplog):
    t = translate("verl", VERL, env={})
    assert t.ok, t.errors
    unknown = {d.source: d.reason for d in t.dropped if d.unknown}
    assert set(unknown) == set(VERL_UNKNOWN)  # today: none of them listed
    for source, close in VERL_UNKNOWN.items():
        assert re.match(rf"unknown verl .*; did you mean {close}\?; ignored", unknown[source]), unknown[source]
    known = {d.source: d for d in t.dropped if not d.unknown}
    assert "global_profiler.steps chooses them" in known["actor_rollout_ref.actor.profiler.tool_config.torch.step_start"].reason
    assert all(d["unknown"] == (d["source"] in VERL_UNKNOWN) for d in t.to_dict()["dropped"])

    with caplog.at_level(logging.INFO, logger="distprof.config.dialects"):
        assert ProfilerConfig.from_dialect("verl", VERL) == t.profiler_config
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == len(VERL_UNKNOWN) and all(any(f" {s}=" in w for w in warned) for s in VERL_UNKNOWN)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(".tool_config.torch.step_start=3 is not honoured" in m for m in info)

    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(VERL))
    code, out, _ = cli("validate", path, "--dialect", "verl")
    assert code == 0 and out.rstrip().splitlines()[-1] == "valid; 4 unknown keys ignored (see Dropped)"
    assert all(s in out for s in VERL_UNKNOWN)


def test_swift_and_slime_list_the_profiler_arguments_they_do_not_know():
    swift = {"enable_profiler": True, "profiler_save_path": "out", "profiler_steps": [1], "profiler_step": [2],
             "profiler_ranks": [0], "profiler_contents": ["cpu"], "learning_rate": 1e-5}
    t = translate("swift", swift)
    assert t.ok and [(d.source, d.unknown) for d in t.dropped] == [("--profiler_step", True)]
    assert "did you mean '--profiler_steps'?" in t.dropped[0].reason  # learning_rate is not the profiler's: not listed

    t = translate("slime", "--use-pytorch-profiler --profile-step-start 3 --profile-step-ends 5 --tensorboard-dir out "
                           "--lr 1e-5", env={"SLIME_PROFILE_WITH_STAK": "0"})
    assert t.ok
    got = {d.source: d.reason for d in t.dropped if d.unknown}
    assert set(got) == {"--profile-step-ends", "env SLIME_PROFILE_WITH_STAK"}
    assert "did you mean '--profile-step-end'?" in got["--profile-step-ends"]
    assert "did you mean 'SLIME_PROFILE_WITH_STACK'?" in got["env SLIME_PROFILE_WITH_STAK"]
