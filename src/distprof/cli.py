"""The distprof command line: parses arguments, calls the library, renders with rich."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Optional

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Profile distributed PyTorch training from config, and get answers from the traces.")
console = Console()
err = Console(stderr=True)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(console=err, show_path=False)])


@app.callback()
def _main(verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-v info, -vv debug).")) -> None:
    _setup_logging(verbose)


@app.command()
def demo(
    out: Optional[str] = typer.Option(None, "--out", help="Run directory to write (default: a new temporary directory)."),
    steps: int = typer.Option(6, "--steps", min=3, help="Training steps per rank."),
    world_size: int = typer.Option(2, "--world-size", min=1, max=8, help="Processes (gloo ranks)."),
) -> None:
    """Run a small 2-process gloo training job under the profiler and show what it wrote."""
    from .demo import gloo_job

    out = out or tempfile.mkdtemp(prefix="distprof-demo-")
    with console.status(f"training {world_size} ranks x {steps} steps under the profiler..."):
        result = gloo_job.run(out, steps=steps, world_size=world_size)
    table = Table(title=f"Traces in {result.run_dir}")
    for col in ("role", "rank", "steps", "file", "bytes"):
        table.add_column(col, justify="right" if col in ("rank", "bytes") else "left")
    for rec in sorted(result.files, key=lambda r: (r["role"], r["rank"], r["steps"])):
        table.add_row(rec["role"], str(rec["rank"]), f"{rec['steps'][0]}-{rec['steps'][1]}", rec["file"], f"{rec['bytes']:,}")
    console.print(table)
    if not result.files:
        err.print("[red]the demo wrote no traces[/red]")
        raise typer.Exit(1)
    console.print(f"Open any of them in https://ui.perfetto.dev, or run: [bold]ls {result.run_dir}[/bold]")


def main() -> None:
    app(prog_name="distprof")


if __name__ == "__main__":  # pragma: no cover
    main()
