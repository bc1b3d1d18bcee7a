"""Every Python block in README.md and in docs/*.md runs as written.

Blocks are collected from the README and from every page under docs/ (a new page is covered as soon as it is
there). Each block runs as ``python block.py`` in a process of its own, in an empty folder (a warm python,
tests/jobs/warmpython.py: forked from a server that imported torch once). A block may leave things to the
reader (the data, the training step, how many steps): the prelude for it fills exactly those, and nothing the
block itself shows. A check after the block asserts that it did what the README says. A new block with no
prelude runs as it is.
"""

import glob
import os
import re
import sys
import textwrap

import pytest
import warmpython

ROOT = os.path.join(os.path.dirname(__file__), "..")
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")

# Ray: loopback only, and a cluster small enough for 2 cores (the README leaves ray.init to the reader).
RAY_INIT = """
import os, logging
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray
ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False, log_to_driver=False,
         logging_level=logging.WARNING)
"""

# Keyed by a line that identifies the block: (prelude, check run after the block).
FILL = {
    'prof = distprof.Profiler(config, role="actor", global_step=start_step)': (
        """
start_step = 0
data = range(12)
def train_step(batch):
    import torch
    torch.randn(64, 64) @ torch.randn(64, 64)
""",
        """
import glob, os
files = sorted(os.path.basename(p) for p in glob.glob("runs/exp1/profile/actor/rank00000/*.pt.trace.json.gz"))
assert files == ["step00000003-00000003.pt.trace.json.gz", "step00000010-00000010.pt.trace.json.gz"], files
""",
    ),
    "from distprof.integrations.ray import ProfiledWorker, ProfiledGroup": (
        RAY_INIT + """
open("profile.yaml", "w").write("enable: true\\nranks: all\\nsteps: [3, 4]\\nsave_path: runs/exp1/profile\\n"
                                "torch: {activities: [cpu]}\\n")
num_steps = 6
batches = [1, 2]
import distprof.integrations.ray as _dr
@ray.remote(num_cpus=0.25)
class Rollout(_dr.ProfiledWorker):
    pass
rollouts = [Rollout.remote()]
""",
        """
import glob
got = sorted(glob.glob("runs/exp1/profile/*/rank*/*.pt.trace.json.gz"))
roles = {p.split("/")[3] for p in got}
assert roles == {"actor", "rollout"}, got
assert not report.unreachable, report
ray.shutdown()
""",
    ),
    "distprof.capture.engines.attach(prof, llm": (
        "",
        """
import glob
assert prof._engine.wait(60)
got = sorted(glob.glob("runs/rl/profile/rollout/engine/rank*/step00000002-00000002.pt.trace.json.gz"))
assert len(got) == 2, got
from distprof.analysis.check import check_run
assert check_run("runs/rl/profile").ok
llm.close()
""",
    ),
    "from distprof.integrations.hf import DistprofCallback": (
        "",
        """
import os
got = sorted(os.listdir("runs/hf/profile/main/rank00000"))
assert got == ["manifest.jsonl", "step00000003-00000004.pt.trace.json.gz"], got
""",
    ),
    "from distprof.integrations.lightning import DistprofProfiler": (
        "",
        """
import os
assert os.path.exists("runs/lightning/main/rank00000/step00000002-00000003.pt.trace.json.gz"), os.listdir("runs")
""",
    ),
}


def pages() -> list[str]:
    """README.md, then docs/*.md in name order."""
    return [README, *sorted(glob.glob(os.path.join(DOCS, "*.md")))]


def blocks_of(page: str) -> list[str]:
    with open(page, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def python_blocks() -> list[tuple[str, int, str]]:
    """(page relative to the repository, index of the block on that page, block), every page's blocks."""
    return [(os.path.relpath(page, ROOT), i, block) for page in pages() for i, block in enumerate(blocks_of(page))]


def _fill(block: str) -> tuple[str, str]:
    for key, (pre, post) in FILL.items():
        if key in block:
            return pre, post
    return "", ""


def test_the_readme_has_python_blocks():
    assert len(blocks_of(README)) >= 2


def test_docs_pages_are_collected():
    names = [os.path.relpath(p, ROOT) for p in pages()]
    assert names[0] == "README.md" and os.path.join("docs", "capture.md") in names
    assert len(python_blocks()) > len(blocks_of(README))


def test_every_fill_entry_is_used_by_exactly_one_block():
    """A prelude whose block moved away (or was copied to a second page) would be skipped, or run twice."""
    for key in FILL:
        users = [f"{page} #{i}" for page, i, block in python_blocks() if key in block]
        assert len(users) == 1, (key, users)


def _block_params():
    # A block that starts Ray joins the ray xdist group: one cluster at a time (test_ray counts leftover raylets).
    return [pytest.param(page, i, marks=[pytest.mark.xdist_group("ray")] if "ray.init" in _fill(b)[0] + b else [],
                         id=f"{page}-{i}")
            for page, i, b in python_blocks()]


@pytest.mark.slow  # each block runs in a process of its own: not the fast loop
@pytest.mark.parametrize("page, index", _block_params())
def test_readme_block_runs(tmp_path, page, index):
    block = blocks_of(os.path.join(ROOT, page))[index]
    pre, post = _fill(block)
    script = tmp_path / "block.py"
    script.write_text(textwrap.dedent(pre) + "\n" + block + "\n" + textwrap.dedent(post))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTPROF_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    proc = warmpython.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, f"{page} block {index} failed:\n{block}\n--- stderr ---\n{proc.stderr[-4000:]}"
