"""docs/configuration.md is generated from the config's field docstrings and kept current."""

from pathlib import Path

from conftest import REPO

from distprof.config.reference import REGENERATE, markdown, undocumented

DOC = Path(REPO) / "docs" / "configuration.md"


def test_every_field_has_a_docstring():
    assert undocumented() == [], "give each of these fields a docstring (what it does, its unit, its default)"


def test_configuration_md_is_current():
    assert DOC.is_file(), f"docs/configuration.md is missing; write it with: {REGENERATE}"
    assert DOC.read_text(encoding="utf-8") == markdown(), (
        f"docs/configuration.md differs from the field docstrings; regenerate it with: {REGENERATE}")


def test_reference_lines_are_short():
    long = [line for line in markdown().splitlines() if len(line) > 120 and not line.startswith("|")]
    assert not long, long
