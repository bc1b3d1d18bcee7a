"""How the command is started: ``distprof --version`` and ``python -m distprof``."""

import importlib.metadata
import json
import subprocess
import sys

import pytest
from tracekit import X, write
from typer.testing import CliRunner

import distprof
from distprof import cli
from distprof.trace import nativelib
from distprof.util.runtime import distprof_version


def test_version_prints_the_installed_version():
    """The first line is the version alone (scripts read it); the second says whether the native decoder is in use."""
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", "--version"], capture_output=True, text=True, timeout=120)
    first, *rest = proc.stdout.splitlines(keepends=True)
    assert (proc.returncode, first, proc.stderr) == (0, f"distprof {importlib.metadata.version('distprof')}\n", "")
    assert rest == [f"{nativelib.status_line()}\n"]


def test_version_says_why_the_native_decoder_is_not_in_use(monkeypatch):
    monkeypatch.setenv("DISTPROF_NATIVE", "0")
    nativelib._forget()
    try:
        proc = CliRunner().invoke(cli.app, ["--version"])
    finally:
        nativelib._forget()
    assert (proc.exit_code, proc.stdout) == (0, f"distprof {distprof_version()}\n"
                                                "native decoder: not in use, switched off (DISTPROF_NATIVE=0)\n")


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
    assert (proc.returncode, proc.stdout.splitlines()[0]) == (0, f"distprof {distprof_version()}")
