"""``distprof hang RUN_DIR``: which rank a hung job waits for (:mod:`distprof.analysis.hang`), in the terminal
(:mod:`distprof.report.hangview`) or as one JSON object (``--json``). Registered by :func:`register`
(``distprof.cli``).

Exit codes as every verb: 0 (the evidence was read: a hang found, or none), 1 (some evidence files could not be
read; the verdict stands on the others), 2 (RUN_DIR is not a folder, or holds no hang evidence: one line naming
the path and the fix).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from distprof.analysis.hang import hang_result
from distprof.analysis.records import to_json
from distprof.cli_support import BadArgument, print_json
from distprof.report import hangview

__all__ = ["register"]


def register(app: typer.Typer, guarded: Callable[[Callable[..., Any]], Callable[..., Any]], console: Console) -> None:
    """Add ``hang`` to ``app`` (``guarded``: the CLI's wrapper that turns errors into exit codes)."""

    @app.command()
    @guarded
    def hang(
        run_dir: str = typer.Argument(..., help="The job's save_path (a local or mounted run directory)."),
        frames: int = typer.Option(8, "--frames", min=1, max=256, help="Frames of each stuck rank's stack shown."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object: hung, stuck_ranks, collective, "
                                                          "ranks, verdict."),
    ) -> None:
        """Which rank a hung job waits for: the first collective some ranks never entered, where those ranks are
        (stack, phase, step) and what the others wait in, from the evidence of hang: {enabled: true}
        (docs/hang.md)."""
        try:
            res = hang_result(run_dir)
        except (OSError, ValueError) as e:
            raise BadArgument(str(e)) from None
        code = 1 if res.errors else 0
        if as_json:
            print_json(to_json(res), code)
        console.print(hangview.view(res, frames=frames))
        raise typer.Exit(code)
