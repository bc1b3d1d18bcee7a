import gzip
import json
import logging
import os

import pytest

# The real traces the tests read, vendored with their licence notices (tests/data/README.md says where each came from).
TESTS = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(TESTS, "data")
# The job scripts and stand-ins the tests start or import (chaos_job.py, crash_job.py, warmfork.py, s3server.py, ...);
# pyproject's pytest ``pythonpath`` puts this folder and tests/ on sys.path, and child processes that import a
# test module get both on PYTHONPATH (``pythonpath_with``).
JOBS = os.path.join(TESTS, "jobs")
REPO = os.path.dirname(TESTS)


def pythonpath_with(*folders):
    """PYTHONPATH for a child process that imports test modules: ``folders``, tests/ (conftest, helpers, tracekit),
    tests/jobs, then what PYTHONPATH held already."""
    old = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*folders, TESTS, JOBS, *([old] if old else [])])


def pytest_configure(config):
    """Compile distprof and the tests' helpers to bytecode once. Our machines set PYTHONDONTWRITEBYTECODE=1, so
    without this every process the suite starts (CLI runs, torchrun ranks, Ray workers: hundreds) compiled
    distprof from source again: 0.8 s against 0.45 s to import it. compileall writes .pyc files whatever that
    variable says; Python still reads them."""
    import compileall
    import sys

    import distprof

    for folder in (os.path.dirname(distprof.__file__), os.path.dirname(__file__)):
        compileall.compile_dir(folder, quiet=2)
    # The same for pytest's own cache of the test modules it rewrites (assert rewriting, about 3 s of CPU per
    # xdist worker): pytest skips writing it while sys.dont_write_bytecode is set. The child processes the tests
    # start keep the machine's setting (the variable).
    sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No DISTPROF_* or rank variables leak in from the machine running the tests; except the native decoder's
    switch and library (``DISTPROF_NATIVE=0 pytest`` runs the suite on the Python decoder, child processes too)."""
    keep = ("DISTPROF_NATIVE", "DISTPROF_NATIVE_LIB")
    for key in list(os.environ):
        if (key.startswith("DISTPROF_") and key not in keep) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                         "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def _reset_annotation_state():
    import sys

    from distprof.capture import annotate as _unused  # noqa: F401


    mod = sys.modules["distprof.capture.annotate"]
    yield
    tel = sys.modules.get("distprof.capture.telemetry")
    if tel is not None:  # a test's telemetry left running: its writer stops, annotate's inert methods come back
        tel._flush_all()
    mod._STATE.active = 0
    mod._STATE.opened = 0
    mod._STATE.profilers.clear()
    mod._tls.__dict__.clear()


def shared_ray():
    """The suite's one local Ray cluster, for the tests of the "ray" xdist group that run on it in this process
    (test_ray's, test_check_truth's, the in-process demos): loopback only, 2 CPUs, its workers able to import
    tests/ and tests/jobs. Started by its first user and kept for the next ones (each start is 5-10 s of a 2-core
    machine, and these tests all run on one xdist worker); a test that needs a cluster of its own (test_multinode's
    several nodes) calls ``ray.shutdown()`` first, and the next user starts it again. Shut down at the session's
    end (``_ray_at_exit``). Returns the ``ray`` module."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # read when Ray is imported: loopback only
    import ray

    if not ray.is_initialized():
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = pythonpath_with(os.path.join(TESTS, "e2e"))  # the raylet and its workers keep it
        try:
            # address="local": a cluster of this process's own, whatever else runs on the machine.
            ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING)
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = old
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}  # loopback only
    return ray


@pytest.fixture(scope="session", autouse=True)
def _ray_at_exit():
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def slow_rollout_demo(tmp_path_factory):
    """The RL demo run once for the tests that read it (real Ray, rollout with its stand-in engine, ref, a 2-rank
    actor, the driver; about 35 s): rollout's generate made 300 ms slower, so rollout bounds every RL step. Tests
    using it are in the "ray" xdist group; it runs on the suite's shared cluster (``shared_ray``)."""
    shared_ray()
    from distprof.demo import rl_job

    return rl_job.run(str(tmp_path_factory.mktemp("slow-rollout") / "demo"), steps=4, slow={"rollout/generate": 300})


def config(save, *, run="run", typed=True, enable=True, **fields):
    """The profiler config every test starts from (the suite's one config helper): enabled, the CPU activity only
    (no GPU needed), saving to ``save``/``run`` (``run=None``: to ``save`` itself); ``fields`` set or replace
    any other field. A ``ProfilerConfig``, or with ``typed=False`` the plain dict (what the HF and Lightning
    callbacks and the trigger tests pass on). ``enable=None`` leaves ``enable`` out (its default). A module fixes
    its own defaults with ``functools.partial(config, steps=[1, 2], ...)``: a call's keywords still win."""
    base = {"save_path": str(save if run is None else os.path.join(str(save), run)), "torch": {"activities": ["cpu"]}}
    if enable is not None:
        base["enable"] = enable
    base.update(fields)
    if not typed:
        return base
    from distprof import ProfilerConfig  # pydantic: the analysis-only test modules never pay for it

    return ProfilerConfig(**base)


def load_trace(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_names(path, prefix=""):
    return [e["name"] for e in load_trace(path)["traceEvents"] if e.get("name", "").startswith(prefix)]


def trace_files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names if ".pt.trace.json" in n]
    return sorted(out)


def all_files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


@pytest.fixture
def caplog_distprof(caplog):
    caplog.set_level(logging.INFO, logger="distprof")
    return caplog


from hypothesis import settings as _hsettings

# Deadlines measure the machine, not the code (the first example imports torch).
_hsettings.register_profile("distprof", deadline=None)
_hsettings.load_profile("distprof")


@pytest.fixture(scope="session")
def s3_server():
    from s3server import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """Environment pointing boto/s3fs at the loopback S3 server (also for subprocesses), and a fresh bucket URL."""
    import fsspec

    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    fsspec.config.conf.setdefault("s3", {})["endpoint_url"] = s3_server.endpoint
    yield s3_server.bucket()
    fsspec.config.conf.get("s3", {}).pop("endpoint_url", None)


# Rank 1's sleep per step in ``ddp_run``. Long enough that rank 0 being slowed by a loaded 2-core machine
# (measured: up to 250 ms of its own work per step with three busy processes beside the job) cannot make it
# the late one: the tests assert structure, not the machine's speed.
SLOW_S = 0.4


def gloo_run(out, **kw):
    """``distprof.demo.gloo_job.run`` with its ranks forked from a server that imported torch (tests/jobs/warmfork.py):
    the same real processes and job, without two imports of torch per job."""
    import warmfork

    from distprof.demo import gloo_job

    warmfork.context()
    return gloo_job.run(out, start_method="forkserver", **kw)


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory):
    """A real 2-process DDP job over gloo (small buckets: overlapping all-reduces), rank 1 sleeping ``SLOW_S``
    in its train/data phase every step, profiled by distprof on steps 2-3 and 5-6 (two windows per rank)."""
    out = str(tmp_path_factory.mktemp("ddp") / "run")
    gloo_run(out, steps=7, world_size=2, config={"steps": "2,3,5,6"}, slow_rank=1, slow_s=SLOW_S, ddp=True)
    return out


# What makes a test slow (``-m "not slow"`` leaves it out of the fast loop; docs/testing.md): a Ray cluster or
# Chromium (the "ray" and "browser" xdist groups, which also keep one of each at a time), the FSDP job, or a
# fixture that runs a multi-process job or the demo. Tests slow for another reason (a torchrun or subprocess job,
# several seconds of work) carry ``@pytest.mark.slow`` themselves.
SLOW_GROUPS = {"ray", "browser", "fsdp_offload"}
SLOW_FIXTURES = {"ddp_run", "slow_rollout_demo", "browser", "cluster"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        groups = {m.args[0] for m in item.iter_markers("xdist_group") if m.args}
        if groups & SLOW_GROUPS or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_xdist_node_collection_finished(node, ids):
    """Under ``--dist loadgroup`` every ``xdist_group`` test's id carries its group (``...@ray``), or the groups are
    silently ignored (pytest 9 with pytest-xdist 3.8: two Ray clusters at once on 2 cores, module fixtures set up
    on both workers, a suite 1.5-2x slower). tests/e2e/test_ray.py's tests are all grouped: stop at once if they lost it."""
    ray = [i for i in ids if "test_ray.py::" in i]
    if node.config.getvalue("dist") == "loadgroup" and ray and not any("@" in i for i in ray):
        pytest.exit(f"pytest-xdist's xdist_group marks are not applied (pytest {pytest.__version__} with this "
                    f"pytest-xdist); install pytest<9, as pyproject.toml pins", returncode=3)
