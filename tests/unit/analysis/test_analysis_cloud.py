"""Analysis of traces on S3 (a real moto server on loopback): folders, run directories written there by the profiler."""

import json
import os

import pytest
from conftest import DATA
from helpers import run
from tracekit import cli

from distprof import Profiler, ProfilerConfig
from distprof.analysis import find_traces

DLRM = os.path.join(DATA, "dlrm-8rank-v100")


def _cli(*args, process=False):
    """``distprof ARGS``: (exit code, parsed --json, stderr); the real CLI app in this process (tracekit.cli) unless
    ``process``."""
    return cli(*args, process=process)


@pytest.mark.slow
def test_summary_and_stragglers_of_a_folder_on_s3(s3):
    import fsspec

    fs = fsspec.filesystem("s3")
    for name in os.listdir(DLRM):
        fs.put_file(os.path.join(DLRM, name), f"{s3}/dlrm/{name}")
    files = find_traces(f"{s3}/dlrm")
    assert len(files) == 8 and all(f.path.startswith("s3://") for f in files)
    (code, r, err), (_, l, _) = _cli("summary", f"{s3}/dlrm", "--json", process=True), _cli("summary", DLRM, "--json")
    assert code == 0, err  # `distprof summary s3://...` in a process of its own, as users run it
    assert r["kernels"] == l["kernels"] and r["ops"] == l["ops"]
    assert sorted(x["rank"] for x in r["ranks"]) == list(range(8))
    code, st, _ = _cli("stragglers", f"{s3}/dlrm", "--json")
    assert code == 0 and st["ranks"][0]["rank"] == 7


@pytest.mark.slow
def test_run_directory_written_to_s3_is_analysed_there(s3, tmp_path):
    url = f"{s3}/run"
    cfg = ProfilerConfig(enable=True, save_path=url, ranks="all", steps=[2, 3], torch={"activities": ["cpu"]})
    for rank in (0, 1):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 5)
    files = find_traces(url)
    assert [(f.role, f.manifest_rank, f.window.steps) for f in files] == [("actor", 0, [2, 3]), ("actor", 1, [2, 3])]
    code, steps, err = _cli("steps", url, "--json")
    assert code == 0, err
    rows = steps["steps"]
    assert [(row["role"], row["step"], len(row["ranks"])) for row in rows] == [("actor", 2, 2), ("actor", 3, 2)]
    out = tmp_path / "merged.json"
    code, merged, _ = _cli("merge", url, "-o", str(out), "--json")
    assert code == 0 and merged["files"] == 2
    labels = {e["args"]["name"] for e in json.loads(out.read_text())["traceEvents"] if e["name"] == "process_name"}
    assert {"actor rank 0", "actor rank 1"} <= {lab.split(" (")[0].split(" / ")[0] for lab in labels}


@pytest.mark.slow
def test_a_second_look_in_one_process_sees_what_changed_since_the_first(s3):
    """A notebook or a driver that checks its run after each step lists the same folder again in one process:
    what was deleted or written since is seen (fsspec keeps listings as long as its filesystem object lives)."""
    import fsspec

    other = fsspec.filesystem("s3", skip_instance_cache=True)  # someone else's client: distprof's cache is not told
    names = sorted(os.listdir(DLRM))
    for name in names[:3]:
        other.put_file(os.path.join(DLRM, name), f"{s3}/grow/sub/{name}")
    assert len(find_traces(f"{s3}/grow")) == 3
    other.rm(f"{s3}/grow/sub/{names[0]}")
    other.put_file(os.path.join(DLRM, names[3]), f"{s3}/grow/sub/{names[3]}")
    other.put_file(os.path.join(DLRM, names[4]), f"{s3}/grow/sub/{names[4]}")
    assert sorted(os.path.basename(f.path) for f in find_traces(f"{s3}/grow")) == names[1:5]
