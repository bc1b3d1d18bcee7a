"""``distprof wrap [--config FILE] [--role ROLE] -- CMD ...``: run one rank of a torchrun, SLURM ``srun`` or plain
launch under the configured process tool when the config selects it, else as CMD itself
(:mod:`distprof.capture.wrapjob`). Registered on the CLI's app by :func:`register` (``distprof.cli``).

Exit codes: CMD's own (a CMD killed by a signal ends ``distprof wrap`` by the same signal); 2 for a config that
cannot be used, no CMD or an unknown option (one line naming the fix); 126 / 127 for a CMD that cannot be run (as
shells).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from distprof.cli_support import bad_argument_if_invalid

__all__ = ["register"]


def register(app: typer.Typer, guarded: Callable[[Callable[..., Any]], Callable[..., Any]], console: Console,
             err: Console) -> None:
    """Add ``wrap`` to ``app`` (``guarded``: the CLI's wrapper that turns errors into exit codes)."""

    @app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
    @guarded
    def wrap(
        cmd: Annotated[list[str] | None, typer.Argument(metavar="-- CMD ...", help="The rank's command, after --.")]
        = None,
        config: str | None = typer.Option(None, "--config", help="The profiler config (YAML, JSON or TOML); "
                                          "default: the DISTPROF_* variables alone, as CMD's Profiler reads them."),
        role: str | None = typer.Option(None, "--role", help="The role the outputs are filed under (default: the "
                                        "one role the config's roles names, else main)."),
    ) -> None:
        """Run CMD under the config's process tool (nsys, rocprof_sys, py_spy, memray) on the ranks it selects;
        every other rank runs CMD itself. For torchrun (--no-python distprof wrap -- python train.py), srun and
        plain launches (README "Process tools outside Ray")."""
        # Imported here: the config brings pydantic, which the analysis verbs never load; the wrapper needs it.
        from distprof.capture.wrapjob import wrap_command
        from distprof.config.model import ProfilerConfig

        cfg = bad_argument_if_invalid(lambda: ProfilerConfig.from_yaml(config) if config else ProfilerConfig())
        # A ValueError comes before CMD starts (a config wrap cannot use): one line, exit 2.
        raise typer.Exit(bad_argument_if_invalid(wrap_command, cfg, list(cmd or []), role))
