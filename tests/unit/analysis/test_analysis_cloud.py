"""Analysis of traces on S3 (a real moto server on loopback): folders, run directories written there by the profiler."""

import json
import os
import subprocess
import sys

import pytest
from conftest import DATA
from helpers import run

from distprof import Profiler, ProfilerConfig
from distprof.analysis import find_traces

DLRM = os.path.join(DATA, "dlrm-8rank-v100")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "distprof.cli", *args], capture_output=True, text=True, env=os.environ.copy())


@pytest.mark.slow
def test_summary_and_stragglers_of_a_folder_on_s3(s3):
    import fsspec

    fs = fsspec.filesystem("s3")
    for name in os.listdir(DLRM):
        fs.put_file(os.path.join(DLRM, name), f"{s3}/dlrm/{name}")
    files = find_traces(f"{s3}/dlrm")
    assert len(files) == 8 and all(f.path.startswith("s3://") for f in files)
    remote, local = _cli("summary", f"{s3}/dlrm", "--json"), _cli("summary", DLRM, "--json")
    assert remote.returncode == 0, remote.stderr
    r, l = json.loads(remote.stdout), json.loads(local.stdout)
    assert r["kernels"] == l["kernels"] and r["ops"] == l["ops"]
    assert sorted(x["rank"] for x in r["ranks"]) == list(range(8))
    st = _cli("stragglers", f"{s3}/dlrm", "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["ranks"][0]["rank"] == 7


@pytest.mark.slow
def test_run_directory_written_to_s3_is_analysed_there(s3, tmp_path):
    url = f"{s3}/run"
    cfg = ProfilerConfig(enable=True, save_path=url, ranks="all", steps=[2, 3], torch={"activities": ["cpu"]})
    for rank in (0, 1):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 5)
    files = find_traces(url)
    assert [(f.role, f.manifest_rank, f.window.steps) for f in files] == [("actor", 0, [2, 3]), ("actor", 1, [2, 3])]
    steps = _cli("steps", url, "--json")
    assert steps.returncode == 0, steps.stderr
    rows = json.loads(steps.stdout)["steps"]
    assert [(row["role"], row["step"], len(row["ranks"])) for row in rows] == [("actor", 2, 2), ("actor", 3, 2)]
    out = tmp_path / "merged.json"
    merged = _cli("merge", url, "-o", str(out), "--json")
    assert merged.returncode == 0 and json.loads(merged.stdout)["files"] == 2
    labels = {e["args"]["name"] for e in json.loads(out.read_text())["traceEvents"] if e["name"] == "process_name"}
    assert {"actor rank 0", "actor rank 1"} <= {lab.split(" (")[0].split(" / ")[0] for lab in labels}
