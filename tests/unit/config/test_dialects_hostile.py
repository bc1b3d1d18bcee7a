"""`distprof validate` under attack (issue 19, item 14): a field of the wrong kind or a list of absurd length ends
in exit 2 and one error line naming the field, never an internal error, minutes of matching, or a folder named
after a mapping's repr. Each case is a real file in tmp_path read by the real CLI (tracekit.cli runs the typer
app)."""

import copy
import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracekit import cli

from distprof import ProfilerConfig
from distprof.config.dialects import load_file
from distprof.config.dialects import translate as _translate
from distprof.config.model import ProfilerConfig as _ProfilerConfig


def translate(*args, **kwargs):  # the dialects are given the config class they validate with
    return _translate(*args, config=_ProfilerConfig, **kwargs)
from distprof.config.errors import ConfigError
from distprof.config.limits import MAX_ROLES

HERE = os.path.join(os.path.dirname(__file__), "dialects")
PATH_ERROR = "expected a directory or URL"


def validate(tmp_path, data, dialect=None, name="cfg.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return cli("validate", path, *(["--dialect", dialect] if dialect else []))


def one_error(code, err, field, words):
    """Exit 2, and stderr is one line that starts with the field: ``error: FIELD = VALUE: WORDS`` (a dialect's
    field) or ``error: FIELD WORDS`` (a distprof config's); no traceback, no internal error."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err[-2000:])
    assert re.match(rf"error: {re.escape(field)}( = | )", lines[0]) and words in lines[0], lines[0]
    assert len(lines[0]) < 700, lines[0]  # the value cut to 160 characters, the message to 400


def verl(tool="torch", save_path="/tmp/verl", role_tool=None):
    actor = {"enable": True, **({"tool": role_tool} if role_tool is not None else {})}
    return {"global_profiler": {"tool": tool, "steps": [1], "save_path": save_path},
            "actor_rollout_ref": {"actor": {"profiler": actor}}}


@pytest.mark.parametrize("tool", [["nsys"], {"a": 1}])
def test_verl_tool_as_a_list_or_mapping_is_one_error_naming_the_field(tmp_path, tool):
    # Was: exit 3, "internal error: TypeError: unhashable type".
    code, _, err = validate(tmp_path, verl(tool=tool), "verl")
    one_error(code, err, "global_profiler.tool", "expected one tool name: torch, nsys")
    code, _, err = validate(tmp_path, verl(role_tool=tool), "verl")
    one_error(code, err, "actor_rollout_ref.actor.profiler.tool", "expected one tool name")


# (dialect, the file as that framework's users write it, dotted path of a path field, the line's field)
PATH_FIELDS = [
    ("verl", "verl_ppo_torch.yaml", "global_profiler.save_path", "global_profiler.save_path"),
    ("nemo_rl", "nemo_rl_env.yaml", "save_path", "save_path"),
    ("rlinf", "rlinf_embodied.yaml", "cluster.profiling.output_dir", "cluster.profiling.output_dir"),
    ("rlinf", "rlinf_rocprof.yaml", "runner.logger.log_path", "runner.logger.log_path"),
    ("skyrl", "skyrl_grpo.yaml", "trainer.policy.torch_profiler_config.save_path",
     "trainer.policy.torch_profiler_config.save_path"),
    ("slime", "slime_args.yaml", "--tensorboard-dir", "--tensorboard-dir"),
    ("swift", "swift_sft.yaml", "profiler_save_path", "--profiler_save_path"),
    ("torchtitan", "torchtitan_llama3.toml", "profiling.save_traces_folder", "profiling.save_traces_folder"),
    ("torchtitan", "torchtitan_llama3.toml", "job.dump_folder", "job.dump_folder"),
]


def with_value(data, dotted, value):
    """``data`` with ``value`` at ``dotted`` (a flag such as ``--tensorboard-dir`` is one key)."""
    data = copy.deepcopy(data)
    parts = [dotted] if dotted.startswith("--") else dotted.split(".")
    cur = data
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return data


@pytest.mark.parametrize("value", [{"a": {"b": 1}}, ["runs", "exp1"]])
@pytest.mark.parametrize("dialect,name,dotted,field", PATH_FIELDS)
def test_a_path_given_as_a_list_or_mapping_is_refused_in_every_dialect(tmp_path, dialect, name, dotted, field, value):
    # Was: accepted by six dialects, save_path "{'a': {'b': 1}}" (a folder of that name once the job ran).
    data = with_value(load_file(os.path.join(HERE, name)), dotted, value)
    code, _, err = validate(tmp_path, data, dialect)
    one_error(code, err, field, PATH_ERROR)
    with pytest.raises(ConfigError, match=PATH_ERROR):  # nor does a job build a Profiler from it
        ProfilerConfig.from_dialect(dialect, data)


_not_a_path = st.recursive(
    st.integers().filter(bool) | st.floats(allow_nan=False).filter(bool) | st.just(True) | st.text(max_size=5),
    lambda inner: st.lists(inner, min_size=1, max_size=3) | st.dictionaries(st.text(max_size=4), inner, min_size=1,
                                                                            max_size=3),
    max_leaves=6,
).filter(lambda v: not isinstance(v, str))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(PATH_FIELDS), value=_not_a_path)
def test_fuzz_any_non_string_path_is_one_error_naming_its_field(case, value):
    dialect, name, dotted, field = case
    t = translate(dialect, with_value(load_file(os.path.join(HERE, name)), dotted, value))
    assert not t.ok and t.profiler_config is None
    assert [e.source for e in t.errors if PATH_ERROR in e.message] == [field], [str(e) for e in t.errors]


def test_nemo_rl_worker_patterns_past_the_limit_are_refused(tmp_path):
    # Was: 10,000 patterns took 101 s (each worker name matched against every pattern, three times), 300,000
    # were killed at 60 s; both exited 0.
    env = {"NRL_NSYS_PROFILE_STEP_RANGE": "1:3", "save_path": str(tmp_path / "p")}
    many = ",".join(f"worker{i}*" for i in range(1000))
    code, _, err = validate(tmp_path, {**env, "NRL_NSYS_WORKER_PATTERNS": many}, "nemo_rl")
    one_error(code, err, "NRL_NSYS_WORKER_PATTERNS", f"holds 1,000 patterns, more than the {MAX_ROLES} roles")
    code, _, err = validate(tmp_path, {**env, "NRL_NSYS_WORKER_PATTERNS": ["*policy*"]}, "nemo_rl")
    one_error(code, err, "NRL_NSYS_WORKER_PATTERNS", "comma-separated worker name patterns in one string")
    at_limit = ",".join(f"worker{i}*" for i in range(MAX_ROLES))
    code, _, err = validate(tmp_path, {**env, "NRL_NSYS_WORKER_PATTERNS": at_limit}, "nemo_rl")
    assert code == 0 and "error" not in err, err[-2000:]


def test_a_native_config_with_thousands_of_roles_is_refused(tmp_path):
    # Was: 10,000 roles took 120 s (4.5 M fnmatchcase calls) and were valid.
    base = {"enable": True, "save_path": str(tmp_path / "p"), "steps": [1]}
    code, _, err = validate(tmp_path, {**base, "roles": [f"r{i}" for i in range(1000)]})
    one_error(code, err, "roles", f"roles holds 1,000 role names, more than the {MAX_ROLES}")
    code, _, err = validate(tmp_path, {**base, "per_role": {f"r{i}": {"ranks": [0]} for i in range(1000)}})
    one_error(code, err, "per_role", f"per_role holds 1,000 entries, more than the {MAX_ROLES}")
    with pytest.raises(ConfigError, match="roles holds 1,000 role names"):  # the Profiler's own config too
        ProfilerConfig(enable=True, save_path=str(tmp_path / "p"), roles=[f"r{i}" for i in range(1000)])
    at_limit = {**base, "roles": [f"r{i}*" for i in range(MAX_ROLES)],
                "per_role": {f"p{i}": {"ranks": [0]} for i in range(MAX_ROLES)}}
    code, out, err = validate(tmp_path, at_limit)
    assert code == 0 and "error" not in err, err[-2000:]


def test_rlinf_long_lists_in_path_and_group_fields_are_refused(tmp_path):
    # Was: output_dir as a 300,000-item list took 34 s and became save_path "['x', 'x', ...]".
    prof = {"backend": "nsight", "worker_groups": ["ActorGroup"], "output_dir": ["x"] * 30_000}
    code, _, err = validate(tmp_path, {"cluster": {"profiling": prof}}, "rlinf")
    one_error(code, err, "cluster.profiling.output_dir", f"{PATH_ERROR}, got a list")
    prof = {**prof, "output_dir": str(tmp_path / "p"), "worker_groups": [f"Group{i}" for i in range(1000)]}
    code, _, err = validate(tmp_path, {"cluster": {"profiling": prof}}, "rlinf")
    one_error(code, err, "cluster.profiling.worker_groups", "holds 1,000 role names")


def test_a_long_list_of_refused_values_is_one_short_line(tmp_path):
    # slime lists every target it refuses: 1,000 of them made one error line of 9 KB.
    args = {"--use-pytorch-profiler": True, "--profile-step-start": 1, "--profile-step-end": 3,
            "--tensorboard-dir": str(tmp_path / "tb"), "--profile-target": [f"target{i}" for i in range(1000)]}
    code, _, err = validate(tmp_path, args, "slime")
    one_error(code, err, "--profile-target", "'target0', 'target1'")
