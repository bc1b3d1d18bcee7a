"""Config is untrusted input: every bad value ends in one readable ConfigError (field or variable, value, fix),
in bounded memory, with none of pydantic's wording; and distprof's own environment is never refused."""

import os
import re
import subprocess
import sys
import tracemalloc
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distprof
from distprof import ProfilerConfig
from distprof.config.model import ConfigError, ScheduleConfig, TorchOptions, _env_fields
from distprof.util.envvars import NOT_SETTINGS

NOISE = re.compile(r"type=|input_value|input_type|errors\.pydantic\.dev|validation errors? for|Value error,|"
                   r"For further information")
SRC = os.path.join(os.path.dirname(distprof.__file__))


def refused(fn, limit_mb=20):
    """The ConfigError ``fn`` raises, checked for readability, and the peak memory it took to get there."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as e:
            fn()
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and not NOISE.search(msg) and len(msg) < 2000, msg
    assert peak_mb < limit_mb, f"{peak_mb:.0f} MB to refuse it"
    return e.value


# ---- sizes are measured before anything is built ------------------------------------------------------------

@pytest.mark.parametrize("steps", [
    "1-1000000000",
    "[0-999999999]",
    "0-600000,700000-1400000",
    ",".join(["0-999999"] * 2000),  # each range alone is allowed; together they are not
    "9" * 5000,  # int() of this many digits raises its own ValueError
])
def test_huge_steps_are_refused_before_they_are_built(steps):
    e = refused(lambda: ProfilerConfig(steps=steps))  # measured, never built: a 1,000,000-step set is ~60 MB
    assert "steps" in str(e) and e.problems[0].field == "steps"


def test_huge_step_range_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("DISTPROF_STEPS", "1-1000000000")
    e = refused(ProfilerConfig)
    assert str(e).startswith("DISTPROF_STEPS=1-1000000000: steps ") and "1,000,000" in str(e) and "schedule" in str(e)


@pytest.mark.slow
def test_step_list_longer_than_the_limit_is_refused_by_length():
    many = list(range(1_000_001))
    e = refused(lambda: ProfilerConfig(steps=many))
    assert "more than 1,000,000 steps" in str(e)


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
steps: [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_yaml_billion_laughs_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(BILLION_LAUGHS)
    assert path.stat().st_size < 400
    e = refused(lambda: ProfilerConfig.from_yaml(path))
    assert str(e).startswith(f"{path}:") and "anchors/aliases" in str(e)
    assert re.match(rf"{re.escape(str(path))}:[5-9]: ", str(e))  # the line of the first alias past the bound


def test_billion_laughs_built_in_python_is_refused_too(tmp_path):
    # yaml.safe_load shares aliased parts, so the 10^9 values take kilobytes until something walks them.
    data = yaml.safe_load(BILLION_LAUGHS)
    e = refused(lambda: ProfilerConfig.from_dict({"steps": data["steps"]}))
    assert "2,000,000 values" in str(e)
    e = refused(lambda: ProfilerConfig.from_dict({"torch": {"activities": data["c"]}}))  # 729 values: walked, shown cut
    assert "torch.activities" in str(e)
    loop = [1]
    loop.append(loop)
    assert "contains itself" in str(refused(lambda: ProfilerConfig(steps=loop)))


@pytest.mark.parametrize("kwargs", [
    dict(backend="x" * 10_000_000),
    dict(ranks=["y" * 1_000_000]),
    dict(roles=["z" * 1_000_000]),
    dict(save_path=b"\x00" * 1_000_000),
    {"q" * 1_000_000: 1},
    dict(torch={"activities": ["w" * 1_000_000]}),
])
def test_huge_values_are_shown_cut_short(kwargs):
    e = refused(lambda: ProfilerConfig(**kwargs), limit_mb=80)
    assert all(len(p.value) <= 80 and len(p.message) <= 400 for p in e.problems)


def test_yaml_python_tag_is_refused_and_never_run(tmp_path):
    made = tmp_path / "made-by-yaml"
    path = tmp_path / "evil.yaml"
    path.write_text(f"enable: true\nsave_path: !!python/object/apply:os.mkdir [{str(made)!r}]\n")
    e = refused(lambda: ProfilerConfig.from_yaml(path))
    assert str(e).startswith(f"{path}:2: ") and "!!python/object" in str(e) and "safe loader" in str(e)
    assert not made.exists()


@pytest.mark.parametrize("text, words", [
    ("enable: true\n  save_path: [\n", [":2: ", "not a valid YAML config", "fix the YAML"]),
    # distprof's own bound (33 levels), then one libyaml stops in its scanner (PyYAML 6.0.4 bundles it): one answer
    ("a: " + "[" * 33 + "]" * 33, [":1: ", "more than 32 deep"]),
    ("a:\n" + "".join(" " * i + "- \n" for i in range(40)) + " " * 40 + "- 1\n", [":", "more than 32 deep"]),
    ("a: " + "[" * 100_000 + "]" * 100_000, [":1: ", "more than 32 deep"]),  # libyaml would crash building it
    ("a: " + "{b: " * 5_000 + "1" + "}" * 5_000, [":1: ", "more than 32 deep"]),
    ("- 1\n- 2\n", ["expected a mapping", "list"]),
    ("a: 1\n---\nb: 2\n", ["not a valid YAML config"]),
])
def test_broken_yaml_names_file_and_line(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    e = refused(lambda: ProfilerConfig.from_yaml(path))
    assert str(e).startswith(str(path))
    for w in words:
        assert w in str(e)


def test_unreadable_config_paths_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    assert "not a regular file" in str(refused(lambda: ProfilerConfig.from_yaml(fifo)))
    assert "cannot read the config file" in str(refused(lambda: ProfilerConfig.from_yaml(tmp_path / "missing.yaml")))
    (tmp_path / "latin1.yaml").write_bytes(b"save_path: caf\xe9\n")
    assert "not UTF-8" in str(refused(lambda: ProfilerConfig.from_yaml(tmp_path / "latin1.yaml")))


# ---- paths, names and messages ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["runs/a\x00b", "runs/a\nINFO fake log line", "runs/\x1b[31mred"])
def test_save_path_with_control_characters_is_refused(path):
    e = refused(lambda: ProfilerConfig(enable=True, save_path=path))
    assert e.problems[0].field == "save_path" and "control character" in str(e) and "\n" not in str(e)


def test_role_names_with_control_characters_are_refused():
    assert "control characters" in str(refused(lambda: ProfilerConfig(roles=["actor\x00"])))


def test_every_problem_is_reported_at_once():
    e = refused(lambda: ProfilerConfig(backend="nsight", ranks="x", steps="y", torch={"record_shape": True}))
    assert sorted(p.field for p in e.problems) == ["backend", "ranks", "steps", "torch.record_shape"]
    assert e.errors == e.problems and len(str(e).splitlines()) == 4
    assert "torch.record_shape=True: unknown setting; did you mean 'record_shapes'?" in str(e) and "choose one of torch, cuda_memory, nsys" in str(e)
    import pickle  # a Ray worker's config error reaches the driver pickled

    again = pickle.loads(pickle.dumps(e))
    assert type(again) is ConfigError and again.problems == e.problems and str(again) == str(e)


@pytest.mark.parametrize("kwargs, text", [
    (dict(enable="maybe"), "enable='maybe': expected 0/1/true/false"),
    (dict(torch=5), "torch=5: expected a mapping of settings"),
    (dict(torch={"gzip": "sometimes"}), "torch.gzip='sometimes': expected 0/1/true/false"),
    (dict(py_spy={"format": "pdf"}), "py_spy.format='pdf': expected one of 'speedscope', 'chrometrace'"),
    (dict(per_node="two"), "per_node must hold whole numbers, got 'two'"),
    (dict(enabled=True, savepath="x"), "enabled=True: unknown setting; did you mean 'enable'?\n"
                                       "savepath='x': unknown setting; did you mean 'save_path'?"),
])
def test_pydantic_wording_is_replaced(kwargs, text):
    assert text in str(refused(lambda: ProfilerConfig(**kwargs)))


def test_sections_built_alone_raise_config_errors_too():
    assert "schedule.active must be >= 1" in str(refused(lambda: ScheduleConfig(active=0)))
    assert str(refused(lambda: TorchOptions(record_shapes="maybe"))) == "record_shapes='maybe': expected 0/1/true/false"
    with pytest.raises(ConfigError):
        ProfilerConfig.from_saved({"steps": "x"})


# ---- the environment -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("var, value, start", [
    ("DISTPROF_ENABLE", "2", "DISTPROF_ENABLE=2: expected 0/1/true/false"),
    ("DISTPROF_RANKS", "x", "DISTPROF_RANKS=x: ranks must hold whole numbers, got 'x'; use 'all'"),
    ("DISTPROF_TORCH_RECORD_SHAPES", "maybe", "DISTPROF_TORCH_RECORD_SHAPES=maybe: expected 0/1/true/false"),
    ("DISTPROF_SCHEDULE_ACTIVE", "0", "DISTPROF_SCHEDULE_ACTIVE=0: schedule.active must be >= 1"),
    ("DISTPROF_BACKEND", "nsight", "DISTPROF_BACKEND=nsight: backend 'nsight' is unknown"),
    ("DISTPROF_SAVE_PATH", " a\tb", "DISTPROF_SAVE_PATH=' a\\tb': save_path"),
    ("DISTPROF_ENABLED", "1", "DISTPROF_ENABLED=1: not a distprof setting; did you mean 'DISTPROF_ENABLE'?"),
])
def test_environment_errors_name_the_variable(monkeypatch, var, value, start):
    monkeypatch.setenv(var, value)
    e = refused(lambda: ProfilerConfig.from_dict({"save_path": "x"}))
    assert str(e).startswith(start), str(e)


def test_every_distprof_variable_distprof_uses_is_known():
    """Grep the package for DISTPROF_* names: each is a setting or listed in envvars.NOT_SETTINGS."""
    settings_vars = set(_env_fields())
    used = set()
    for root, _, files in os.walk(SRC):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name)) as f:
                    used |= set(re.findall(r"DISTPROF_[A-Z][A-Z_]*[A-Z]", f.read()))
    assert used, "the grep found nothing"
    assert used - settings_vars <= NOT_SETTINGS
    with mock.patch.dict(os.environ, {v: "x" for v in NOT_SETTINGS}):
        assert ProfilerConfig().enable is False


def test_a_worker_wrapped_by_distprof_builds_its_config(tmp_path):
    """The real process wrapper (python -m distprof.capture.wrap) with the real py-spy sets DISTPROF_WRAPPED_BY in the
    worker; the worker's config must not take it for a typo."""
    from distprof.capture.backends.process import WrapSpec, check_tool

    spec = WrapSpec(backend="py_spy", group="rollout", out_dir=str(tmp_path / "rollout"), python=[sys.executable],
                    executable=check_tool("py_spy", None, [sys.executable]), extra={"rate": 50, "format": "raw"})
    app = tmp_path / "app.py"
    app.write_text("import os, sys\nfrom distprof import ProfilerConfig\n"
                   "c = ProfilerConfig(steps=[1])\n"
                   "print('WRAPPED_BY', os.environ['DISTPROF_WRAPPED_BY'], c.steps, file=sys.stderr, flush=True)\n")
    proc = subprocess.run([sys.executable, "-m", "distprof.capture.wrap", spec.encode(), str(app)], capture_output=True,
                          text=True, timeout=120, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"WRAPPED_BY py_spy:\d+ \[1\]", proc.stderr), proc.stderr[-2000:]


# ---- fuzz: whatever comes in, a config or one readable ConfigError ----------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats() | st.text(max_size=12)
    | st.sampled_from(["all", "auto", "cpu", "3,10-12", "0-5", "torch", "nsys", "raise", "*", "x/../y", "1e3"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _section(model):
    return st.dictionaries(st.sampled_from([*model.model_fields, "typo"]), _json, max_size=4) | _json


_FIELDS = {name: _json for name in ProfilerConfig.model_fields}
for _name, _f in ProfilerConfig.model_fields.items():
    _ann = _f.annotation if _name != "schedule" else ScheduleConfig
    if isinstance(_ann, type) and hasattr(_ann, "model_fields"):
        _FIELDS[_name] = _section(_ann)
_configs = st.fixed_dictionaries({}, optional={**_FIELDS, "enabled": _json})
_env_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_envs = st.dictionaries(st.sampled_from([*sorted(_env_fields()), "DISTPROF_TYPO", *sorted(NOT_SETTINGS)]),
                        _env_text | st.sampled_from(["1", "0", "true", "all", "3,10-12", "null", "cpu,cuda"]),
                        max_size=4)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_configs, env=_envs)
def test_fuzz_any_input_gives_a_config_or_a_readable_error(data, env):
    with mock.patch.dict(os.environ, env):
        try:
            c = ProfilerConfig.from_dict(data)
        except ConfigError as e:
            msg = str(e)
            # (the values given are echoed: pydantic's noise is only noise where the input did not bring it;
            # hypothesis draws strings from the test's own constants, this regex's among them)
            echoed = msg
            for v in {str(x) for x in [*env.values(), *_leaves(data)]}:
                if NOISE.search(v):  # (only a value that carries such text itself is taken out)
                    echoed = echoed.replace(v, "")
            assert msg and not NOISE.search(echoed) and len(msg) < 2000, msg
            assert e.problems and all(p.message and len(p.value) <= 80 for p in e.problems)
        else:
            assert ProfilerConfig.from_saved(c.model_dump()) == c  # what validates, round-trips


def _leaves(x):
    """Every scalar in a JSON-ish value (and the keys of its dicts)."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    else:
        yield x
