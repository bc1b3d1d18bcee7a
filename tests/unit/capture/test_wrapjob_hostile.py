"""``distprof wrap`` with a command name no shell would run (red-team pass): an empty name or one with a NUL byte
ends as a shell's "not found" (127), never as exit 2 with execv's own message."""

import pytest
from typer.testing import CliRunner

from distprof.capture.wrapjob import _exec, wrap_command
from distprof.cli import app
from distprof.config.model import ProfilerConfig


def test_an_empty_command_name_is_not_found_as_in_a_shell(tmp_path):
    assert wrap_command(ProfilerConfig(), [""]) == 127
    cfg = ProfilerConfig(enable=True, backend="memray", save_path=str(tmp_path / "run"))
    assert wrap_command(cfg, ["", "x"]) == 127  # selected: no tool is started for it
    res = CliRunner().invoke(app, ["wrap", "--", ""])
    assert res.exit_code == 127, res.output


def test_a_name_with_a_nul_byte_is_not_found_not_a_value_error():
    with pytest.raises(SystemExit) as e:
        _exec(["tru\0e"])
    assert e.value.code == 127


def test_a_mistyped_option_is_refused_not_run_as_the_command():
    with pytest.raises(ValueError, match="unknown option '--confg'"):
        wrap_command(ProfilerConfig(), ["--confg", "x.yaml", "--", "true"])
    res = CliRunner().invoke(app, ["wrap", "--confg", "x.yaml", "--", "true"])
    assert res.exit_code == 2 and "--config" in res.output
