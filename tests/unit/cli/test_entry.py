"""How the command is started: ``distprof --version`` and ``python -m distprof``."""

import importlib.metadata
import json
import subprocess
import sys

import pytest
from tracekit import X, write

import distprof
from distprof.util.runtime import distprof_version


def test_version_prints_the_installed_version():
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"distprof {importlib.metadata.version('distprof')}\n", "")


def test_version_without_installed_metadata_is_the_package_own(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert distprof_version() == distprof.__version__


@pytest.mark.slow
def test_python_m_distprof_runs_the_cli(tmp_path):
    write(tmp_path / "rank-0.json", [X("ProfilerStep#1", 0, 100, cat="user_annotation"), X("aten::mm", 10, 20)])
    proc = subprocess.run([sys.executable, "-m", "distprof", "summary", str(tmp_path), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [(o["name"], o["count"]) for o in json.loads(proc.stdout)["ops"]] == [("aten::mm", 1)]
    proc = subprocess.run([sys.executable, "-m", "distprof", "--version"], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, f"distprof {distprof_version()}\n")
