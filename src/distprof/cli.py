"""The distprof command line: parses arguments, calls the library, renders with rich.

Exit codes (every verb, with or without ``--json``): 0 every file was read; 1 some files could not be
read (each is named); 2 nothing could be read, or the arguments are wrong; 3 an internal error (a bug:
one line, the traceback with ``--debug``). With ``--json`` stdout holds one JSON object whatever the code.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer
from rich.logging import RichHandler
from rich.text import Text

from distprof import analysis, cli_hang, cli_open, cli_watch, cli_wrap
from distprof.analysis.records import UNSET, Envelope, to_json
from distprof.cli_support import (
    BadArgument,
    bad_argument_if_invalid,
    default_report_path,
    failure_doc,
    input_error,
    print_json,
    progress_bar,
)
from distprof.report import commands, telemetry_view
from distprof.report import terminal as render
from distprof.report.termfit import FitConsole
from distprof.trace import nativelib

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Profile distributed PyTorch training from config, and get answers from the traces.")
# On a terminal everything fits its width (termfit); a file or a pipe gets tables laid out for 200 columns with
# names whole, and each message on one line.
console = FitConsole()
if not console.is_terminal:
    console.width = max(console.width, 200)
err = FitConsole(stderr=True)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(console=err, show_path=False)])
    if verbose == 0:  # -v wins over the environment
        from distprof.util.envvars import apply_log_level

        apply_log_level()


EXIT_OK, EXIT_SOME_UNREADABLE, EXIT_NOTHING, EXIT_INTERNAL = 0, 1, 2, 3
_debug = {"on": False}


def _version(value: bool) -> None:
    if value:
        from distprof.util.runtime import distprof_version

        typer.echo(f"distprof {distprof_version()}")  # the first line stays this alone: scripts read it
        typer.echo(nativelib.status_line())
        raise typer.Exit()


@app.callback()
def _main(verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-v info, -vv debug)."),
          debug: bool = typer.Option(False, "--debug", help="Show the traceback of an internal error."),
          _v: bool = typer.Option(False, "--version", is_eager=True, callback=_version, help="Print the version."),
          ) -> None:
    _debug["on"] = debug
    _setup_logging(verbose)


def _guarded(fn: Callable) -> Callable:
    """A verb's body: unreadable input and bad arguments end in one line and exit 2; anything else is a
    bug, reported in one line with exit 3 (the traceback with --debug, and in the log at debug level).
    With --json, stdout carries one JSON object either way (see :func:`.cli_support.failure_doc`)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except Exception as e:
            if input_error(e):
                err.print(Text.assemble(("error: ", "red"), render.plain(e)), soft_wrap=True)
                if as_json:
                    print_json(failure_doc(fn.__name__, kwargs, e, internal=False), EXIT_NOTHING)
                raise typer.Exit(EXIT_NOTHING) from None
            logging.getLogger("distprof").debug("internal error", exc_info=True)
            if _debug["on"]:
                err.print(traceback.format_exc(), markup=False, highlight=False)
            err.print(Text.assemble(("internal error: ", "red"), f"{type(e).__name__}: {render.plain(e)}"
                                    f"{'' if _debug['on'] else ' (run with --debug for the traceback)'}"),
                      soft_wrap=True)
            if as_json:
                print_json(failure_doc(fn.__name__, kwargs, e, internal=True), EXIT_INTERNAL)
            raise typer.Exit(EXIT_INTERNAL) from None
    return run


@app.command()
@_guarded
def demo(
    out: str | None = typer.Option(None, "--out", help="Run directory to write (default: a new temporary directory)."),
    steps: int = typer.Option(5, "--steps", min=3, help="RL steps to run; the two before the last are profiled."),
    slow: list[str] | None = typer.Option(None, "--slow", metavar="ROLE/PHASE:MS", help="Sleep MS in that phase "  # noqa: B008 (typer)
        "every step (repeatable; actor phases: rank 1), e.g. rollout/generate:300. Default: actor/prepare:150."),
    slow_ms: float | None = typer.Option(None, "--slow-ms", min=0.0, help="--slow actor/prepare:MS"),
    async_rollout: bool = typer.Option(False, "--async", help="Rollout generates step N+1 during step N's update"),
) -> None:
    """Run a small RL job (driver, rollout, reference, 2-rank actor) on a local Ray cluster under the profiler,
    then diagnose it and write the HTML report next to the traces."""
    from distprof.demo import rl_job

    planned = bad_argument_if_invalid(rl_job.parse_slow, slow or [])  # a bad ROLE/PHASE: exit 2 before Ray starts
    out = out or tempfile.mkdtemp(prefix="distprof-demo-")
    with console.status("starting...") as status:
        result = rl_job.run(out, steps=steps, progress=status.update, slow_ms=slow_ms, slow=planned if slow else None,
                            async_rollout=async_rollout)
    console.print(render.files_table(result.run_dir, result.files))
    console.print(f"mean reward per step: {', '.join(f'{r:.3f}' for r in result.rewards)}")
    if not result.check.ok:
        err.print(f"[red]the run directory is incomplete[/red]; see: distprof check {result.run_dir}", soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"[green]distprof check passed[/green]: {len(result.files)} windows from "
                  f"{len({(f['role'], f['rank']) for f in result.files})} workers, collected through Ray.",
                  soft_wrap=True)
    run = analysis.open(result.run_dir, workers=1)  # read once: the report, the RL steps and the findings
    with console.status("diagnosing and writing the report..."):
        page = run.report(os.path.join(result.run_dir, "report.html"))
        findings = run.diagnose()
    # each profiled RL step: every role's busy and idle time, its path, the what-if
    render.rl_steps(console, run.steps())
    console.print(Text(f"Diagnosis ({len(findings)} finding{'s' if len(findings) != 1 else ''}):"))
    for k, f in enumerate(findings[:3], 1):
        console.print(Text(f"  {k}. {render.plain(f.claim)}"), soft_wrap=True)
    console.print(Text(f"Report: {page} (open it in a browser; it works offline)"), soft_wrap=True)
    for line in ["Next:"] + [f"  distprof {c.format(result.run_dir)}" for c in ("diagnose {}", "summary {}", "steps {}",
                 "stragglers {}", "merge {} -o merged.json.gz", "check {}")] + ["  open any trace in https://ui.perfetto"
                 ".dev (phases: driver/generate, rollout/generate, ref/log_probs, actor/update, actor/sync_weights)"]:
        console.print(line, soft_wrap=True)


@app.command()
@_guarded
def check(
    run_dir: str = typer.Argument(..., help="A run directory (the save_path of a run, or collect()'s dest)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Say, per role and rank, which expected windows exist and parse, and which are missing or broken.

    Exit code 0 when the run directory is complete, 1 when something is missing or broken, 2 when the path is
    not a run directory or cannot be read.
    """

    from distprof.analysis.check import STATUSES, check_run

    result = check_run(run_dir)
    code = EXIT_NOTHING if result.error else EXIT_OK if result.ok else EXIT_SOME_UNREADABLE
    if as_json:
        # errors: what could not be read at all (the path itself, or a file that does not decode)
        errors = [{"path": run_dir, "message": result.error}] if result.error else []
        errors += [{"path": i.file or run_dir, "message": f"{i.file or run_dir}: {i.detail or i.status}"}
                   for i in result.items if i.status == "broken"]
        print_json({**result.to_dict(), "errors": errors}, code)
    if result.error:
        err.print(Text.assemble(("error: ", "red"), render.plain(result.error)), soft_wrap=True)
        raise typer.Exit(code)
    table = render.table(Text(f"distprof check {render.plain(result.run_dir)}"),
                         ["role", "rank", ("steps", "fixed"), ("status", "fixed"), ("file", "name"), "detail"])
    colors = {"ok": "green", "unlisted": "yellow", "not_reached": "yellow"}
    for i in result.items:
        steps = f"{i.steps[0]}-{i.steps[1]}" if i.steps else ""
        c = colors.get(i.status, "red")
        table.add_row(Text(render.plain(i.role)), "" if i.rank is None else str(i.rank), steps, Text(i.status, style=c),
                      Text(render.plain(i.file)), Text(render.plain(i.detail)))
    if result.items:
        console.print(table)
    for p in result.problems:
        err.print(Text.assemble(("problem: ", "red"), render.plain(p)), soft_wrap=True)
    for n in result.notes:
        err.print(Text.assemble(("note: ", "yellow"), render.plain(n)), soft_wrap=True)
    bad = sum(1 for i in result.items if STATUSES[i.status][1])
    if result.ok:
        console.print(f"[green]complete[/green]: {len(result.items)} entries checked")
    else:
        console.print(f"[red]incomplete[/red]: {bad} of {len(result.items)} entries fail the check, "
                      f"{len(result.problems)} problems")
    raise typer.Exit(code)


# ---- shared options ---------------------------------------------------------------------------------------
def _opt_ranks():
    return typer.Option(None, "--ranks", help="Only these global ranks: 0,3-5.")


def _opt_roles():
    return typer.Option(None, "--roles", help="Only these roles (names or globs): actor,rollout*.")


def _opt_steps():
    return typer.Option(None, "--steps", help="Only work inside these steps (ProfilerStep#N): 3,5-7.")


def _opt_steps_only():
    return typer.Option(False, "--steps-only",
                        help="Count only work inside ProfilerStep ranges (default: the whole trace).")


def _opt_workers():
    return typer.Option(None, "--workers", min=1, help="Processes reading files in parallel (default: CPU count).")


def _opt_ray():
    return typer.Option(None, "--ray", help="Read files as tasks on this Ray cluster ('local' starts one on loopback): "
                        "the path is listed on every node and each file read on the node that holds it; quote "
                        "'$VAR/path' for a per-node folder.")


def _selection(ranks: str | None, roles: str | None, steps: str | None, steps_only: bool,
               rank: int | None = None):
    from distprof.trace.selection import Selection

    if rank is not None:
        ranks = str(rank) if ranks is None else f"{ranks},{rank}"
    try:
        return Selection.of(ranks=ranks, roles=roles, steps=steps, steps_only=steps_only)
    except ValueError as e:
        raise BadArgument(str(e)) from None


R = TypeVar("R")


def _run(call: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    bar, show = progress_bar(err)
    with bar:
        return call(*args, progress=show, **kwargs)


def _done(result: Any, as_json: bool, draw: Callable[[], None]) -> None:
    """Print ``result`` (--json: one object on stdout; else tables, problems on stderr) and exit with its code.
    ``result``: a verb's record (``draw`` renders it; ``problems`` reads its envelope; its ``--json`` object,
    ``to_json(result)``, is what --json prints and gives the exit code) or the ``--json`` object of a verb without
    one (merge, report: :class:`~distprof.analysis.records.Envelope` of it)."""
    from distprof.analysis.analyze import exit_code

    doc = to_json(result)
    code = exit_code(doc)
    if as_json:
        print_json(doc, code)
    rec = Envelope.of(result) if isinstance(result, dict) else result
    if rec.files_read is UNSET or rec.files_read or getattr(result, "telemetry_read", 0):  # (steps: telemetry alone)
        draw()
    render.problems(err, rec)
    raise typer.Exit(code)


PATH_HELP = "A trace file, a folder of traces, or a run directory (local or fsspec URL)."


# ---- verbs --------------------------------------------------------------------------------------------------
@app.command()
@_guarded
def summary(
    path: str = typer.Argument(..., help=PATH_HELP),
    top: int = typer.Option(15, "--top", min=1, help="Rows per table."),
    rank: int | None = typer.Option(None, "--rank", hidden=True, help="Only this rank (same as --ranks R)."),
    ranks: str | None = _opt_ranks(), roles: str | None = _opt_roles(), steps: str | None = _opt_steps(),
    steps_only: bool = _opt_steps_only(), workers: int | None = _opt_workers(), ray_address: str | None = _opt_ray(),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print one JSON object: kernels, ops, phases, categories, ranks, ..."),
    peak_tflops: float | None = typer.Option(
        None, "--peak-tflops", min=0.001,
        help="Peak TFLOP/s for MFU, for every device and dtype (default: the table for the trace's device)."),
) -> None:
    """Where the time goes: device kernels, CPU ops and phases over all ranks; per rank its device and host
    breakdown (compute, exposed communication, memory, idle), comm/compute overlap and average step; FLOPs,
    TFLOP/s and MFU per step when the traces have shapes (record_shapes)."""
    from distprof.analysis import analyze

    sel = _selection(ranks, roles, steps, steps_only, rank)
    s = _run(analyze.summary_result, path, selection=sel, top=top, workers=workers, ray_address=ray_address,
             peak_tflops=peak_tflops)
    _done(s, as_json, lambda: render.summary(console, s))


@app.command()
@_guarded
def stragglers(
    path: str = typer.Argument(..., help="Traces of several ranks: a folder, or a run directory."),
    top: int = typer.Option(10, "--top", min=1, help="Worst collectives to list."),
    ranks: str | None = _opt_ranks(), roles: str | None = _opt_roles(), steps: str | None = _opt_steps(),
    steps_only: bool = _opt_steps_only(), workers: int | None = _opt_workers(), ray_address: str | None = _opt_ray(),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print one JSON object: ranks, steps, worst, mismatched, waits."),
) -> None:
    """Match collectives across ranks: who arrives last, how long the others wait for it."""
    from distprof.analysis import analyze

    sel = _selection(ranks, roles, steps, steps_only)
    r = _run(analyze.stragglers_result, path, selection=sel, top=top, workers=workers, ray_address=ray_address)
    _done(r, as_json, lambda: render.stragglers(console, err, r))


@app.command()
@_guarded
def steps(
    path: str = typer.Argument(..., help=PATH_HELP),
    phases: int = typer.Option(4, "--phases", min=1, help="Phases (annotations) to show per rank."),
    ranks: str | None = _opt_ranks(), roles: str | None = _opt_roles(), steps: str | None = _opt_steps(),
    steps_only: bool = _opt_steps_only(), workers: int | None = _opt_workers(), ray_address: str | None = _opt_ray(),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: steps, each with every rank's figures."),
    peak_tflops: float | None = typer.Option(None, "--peak-tflops", min=0.001,
                                             help="Peak TFLOP/s for MFU (as summary's)."),
) -> None:
    """Per step and rank: duration, time waiting for peers, phases; the rank that holds the others back; achieved
    TFLOP/s and MFU where the traces have shapes (record_shapes)."""
    from distprof.analysis import analyze

    sel = _selection(ranks, roles, steps, steps_only)
    d = _run(analyze.steps_result, path, selection=sel, workers=workers, ray_address=ray_address,
             peak_tflops=peak_tflops)
    if not d.steps and not as_json and d.files_read:
        err.print("no steps in these traces: no ProfilerStep#N ranges (torch writes them when profiler.step() is "
                  "called) and no distprof manifest window for these files", style="yellow", soft_wrap=True)

    def draw() -> None:
        render.steps(console, d, phases=phases)
        telemetry_view.telemetry(console, d)  # the run's step telemetry, when it keeps one

    _done(d, as_json, draw)


@app.command()
@_guarded
def diagnose(
    path: str = typer.Argument(..., help=PATH_HELP),
    ranks: str | None = _opt_ranks(), roles: str | None = _opt_roles(), steps: str | None = _opt_steps(),
    steps_only: bool = _opt_steps_only(), workers: int | None = _opt_workers(), ray_address: str | None = _opt_ray(),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print one JSON object: findings (ranked), analysed, thresholds."),
) -> None:
    """What is wrong, in words: findings ranked by the step time they cost, each with its evidence, what fixing it
    would save on the step's path across ranks, and a next step."""
    from distprof.analysis import analyze

    sel = _selection(ranks, roles, steps, steps_only)
    d = _run(analyze.diagnose_result, path, selection=sel, workers=workers, ray_address=ray_address)
    _done(d, as_json, lambda: render.diagnose(console, d))


@app.command()
@_guarded
def merge(
    path: str = typer.Argument(..., help="Traces of several ranks/roles: a folder or a run directory."),
    out: str = typer.Option(..., "-o", "--out", help="Output trace (.json or .json.gz) for Perfetto or chrome://tracing;"
                            " .tar: a Perfetto archive of the traces as they are (--format perfetto)."),
    ranks: str | None = _opt_ranks(), roles: str | None = _opt_roles(), steps: str | None = _opt_steps(),
    workers: int | None = _opt_workers(),
    fmt: str | None = typer.Option(None, "--format", help="json (one merged trace) or perfetto (a .tar of the"
                                   " per-rank traces and a perfetto_manifest; Perfetto v58+); default: by -o's name."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object describing the output."),
) -> None:
    """One trace with every rank and role as its own process track, clocks aligned, every event kept
    (with --steps: every event that overlaps those steps); --format perfetto: the traces unchanged in one archive
    Perfetto opens as one timeline (with --steps: the files holding those steps)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from distprof.analysis.merge import merge_traces
    from distprof.analysis.perfetto_archive import archive_traces

    if (fmt := fmt or ("perfetto" if out.endswith(".tar") else "json")) not in ("json", "perfetto"):
        raise BadArgument(f"--format {fmt}: not a merge format; give json or perfetto")
    sel = _selection(ranks, roles, steps, False)
    with Progress(TextColumn("merging"), BarColumn(), MofNCompleteColumn(), console=err, transient=True) as bar:
        task = bar.add_task("merge", total=None)
        r = (archive_traces if fmt == "perfetto" else merge_traces)(
            path, out, selection=sel, workers=workers, progress=lambda done, total: bar.update(task, completed=done,
                                                                                                total=total))

    def draw() -> None:
        where = render.plain(r["out"])
        console.print(Text(f"archived {r['files']} traces -> {where} (open it: distprof open {where})" if fmt ==
                           "perfetto" else f"merged {r['files']} traces, {r['events']:,} events -> {where} "
                           "(open in https://ui.perfetto.dev)"), soft_wrap=True)
        if r.get("moved_to_lanes"):
            console.print(f"{r['moved_to_lanes']:,} events overlapped others on their thread (Perfetto would hide "
                          "them): shown on '(overlaps, lane K)' threads", soft_wrap=True)

    _done(r, as_json, draw)


@app.command()
@_guarded
def diff(
    a: str = typer.Argument(..., help="Baseline: a trace, a folder of traces or a run directory."),
    b: str = typer.Argument(..., help="Compared: same kinds as A (may be the same path with --rank-b or --step-b)."),
    rank_a: int | None = typer.Option(None, "--rank-a", help="Only this rank of A."),
    rank_b: int | None = typer.Option(None, "--rank-b", help="Only this rank of B."),
    step_a: int | None = typer.Option(None, "--step-a", help="Only work inside ProfilerStep#N of A."),
    step_b: int | None = typer.Option(None, "--step-b", help="Only work inside ProfilerStep#N of B."),
    roles: str | None = _opt_roles(), steps_only: bool = _opt_steps_only(),
    top: int = typer.Option(20, "--top", min=1, help="Rows to show."),
    workers: int | None = _opt_workers(), ray_address: str | None = _opt_ray(),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: rows, totals, only_in_a, only_in_b."),
) -> None:
    """What got slower or faster between two runs, two steps or two ranks: per kernel, op (self time), phase, category."""  # noqa: E501 (typer's help shows line breaks)
    from distprof.analysis import analyze

    sel_a = _selection(None, roles, None if step_a is None else str(step_a), steps_only, rank_a)
    sel_b = _selection(None, roles, None if step_b is None else str(step_b), steps_only, rank_b)
    d = _run(analyze.diff_result, a, b, selection_a=sel_a, selection_b=sel_b, top=top, workers=workers,
             ray_address=ray_address)
    _done(d, as_json, lambda: render.diff(console, d))


@app.command()
@_guarded
def report(
    path: str = typer.Argument(..., help=PATH_HELP),
    out: str | None = typer.Option(None, "-o", "--out", help="Output HTML file (one self-contained page; opens "
                                      "offline). Default: PATH/report.html for a folder, NAME.report.html beside a "
                                      "single trace, ./report.html for a URL."),
    compare: str | None = typer.Option(None, "--compare",
                                       help="Another run to compare with (adds the run-to-run diff)."),
    ranks: str | None = _opt_ranks(), roles: str | None = _opt_roles(), steps: str | None = _opt_steps(),
    steps_only: bool = _opt_steps_only(), workers: int | None = _opt_workers(), ray_address: str | None = _opt_ray(),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: out, bytes, findings, plots, ..."),
) -> None:
    """One HTML file: the diagnosis at the top, each finding linked to the plot that shows it, then the plots."""
    from distprof.report import write_report
    from distprof.trace.source import TraceError

    sel = _selection(ranks, roles, steps, steps_only)
    chosen = out is None
    if chosen:
        out = default_report_path(path)
        err.print(Text(f"no -o given: writing {render.plain(out)}"), soft_wrap=True)
    try:
        r = _run(write_report, path, out, compare=compare, selection=sel, workers=workers, ray_address=ray_address)
    except TraceError as e:
        if chosen and str(e).startswith(f"{out}:"):  # the default place is refused (a read-only folder, ...)
            raise TraceError(f"{e}; give -o FILE to write the report elsewhere") from None
        raise

    def draw() -> None:
        n = len(r["findings"])
        console.print(Text(f"report: {render.plain(r['out'])} ({r['bytes']:,} bytes, "
                           f"{n} finding{'' if n == 1 else 's'}; open it in a browser, no network needed)"),
                      soft_wrap=True)

    _done(r, as_json, draw)


@app.command()
@_guarded
def validate(
    file: str = typer.Argument(..., help="A config file: YAML, JSON or TOML."),
    dialect: str | None = typer.Option(
        None, "--dialect", help="The framework the config is written for: verl, skyrl, slime, swift, rlinf, "
                                "torchtitan, nemo_rl (default: a distprof config)."),
    section: str | None = typer.Option(None, "--section", help="Dotted path to the part of the file that holds the "
                                                                  "config, e.g. trainer.policy.torch_profiler_config."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: config, roles, mapping, dropped, "
                                                       "errors, warnings."),
) -> None:
    """Check a profiler config, distprof's own or another framework's (--dialect): the distprof config it becomes,
    each role's captures, the mapping field by field, what is dropped and why, every error at once, and warnings
    when it would capture nothing.

    Exit code 0 valid; 1 valid, but it captures less than it asks for (see the warnings); 2 invalid or unreadable.
    """
    from distprof.config.dialects import NATIVE, ConfigFileError, load_file, translate
    from distprof.config.model import ProfilerConfig

    try:
        t = translate(dialect or NATIVE, load_file(file), section, config=ProfilerConfig)
    except (ConfigFileError, ValueError) as e:  # an unreadable file or an unknown dialect: one line, exit 2
        if as_json:
            print_json({"file": file, "dialect": dialect, "valid": False,
                         "errors": [{"path": file, "source": file, "message": str(e), "text": str(e)}], "warnings": []},
                        EXIT_NOTHING)
        err.print(Text.assemble(("error: ", "red"), render.plain(e)), soft_wrap=True)
        raise typer.Exit(EXIT_NOTHING) from None
    code = EXIT_NOTHING if not t.ok else EXIT_SOME_UNREADABLE if t.warnings else EXIT_OK
    if as_json:
        doc = {"file": file, **t.to_dict()}
        doc["errors"] = [{"path": file, **e} for e in doc["errors"]]  # each config problem is about this file
        print_json(doc, code)
    out, errs = commands.validation(t, file)
    for part in out[:-1]:
        console.print(part, soft_wrap=isinstance(part, Text))
    for line in errs:
        err.print(line, soft_wrap=True)
    console.print(out[-1])
    raise typer.Exit(code)


@app.command()
@_guarded
def trigger(
    run_dir: str = typer.Argument(..., help="The running job's save_path (local, file:// or an fsspec URL)."),
    steps: int | None = typer.Option(None, "--steps", help="How many consecutive global steps to capture."),
    ranks: str | None = typer.Option(None, "--ranks", help="Only these global ranks: 0,3-5 (default: every rank "
                                                              "the job's config selects)."),
    roles: str | None = typer.Option(None, "--roles", help="Only these roles (names or globs): actor,rollout*."),
    backend: str = typer.Option("torch", "--backend", help="torch or cuda_memory (a CUDA device is needed)."),
    flags: str | None = typer.Option(None, "--flags", help="torch.profiler options for this window: record_shapes,"
                                                              "profile_memory,with_stack,with_flops,with_modules."),
    lead_steps: int = typer.Option(5, "--lead-steps", help="Start at least this many steps after the first process "
                                                           "sees the request."),
    align: int = typer.Option(10, "--align",
                              help="Start on a multiple of this step (so ranks a few steps apart agree)."),
    start_step: int | None = typer.Option(None, "--start-step", help="Start at this global step instead."),
    tag: str = typer.Option("", "--tag", help="Make an otherwise identical request a new one (to capture again)."),
    show_status: bool = typer.Option(False, "--status", help="Show the requests and each rank's answer."),
    rid: str | None = typer.Option(None, "--id", help="With --status: only this request."),
    wait: float | None = typer.Option(None, "--wait", min=0.0, help="Wait up to this many seconds until every "
                                                                       "rank that answered has captured, refused or "
                                                                       "skipped."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Capture steps of a running job on demand: every process that opted in (trigger: true, or DISTPROF_TRIGGER=1)
    picks the request up at a step boundary, and all selected ranks record the same global steps.

    Exit code 0 sent (or, with --status, shown); 1 --wait ended before every answer was final; 2 bad arguments,
    not a run directory, or the requests folder cannot be read or written (one line naming it and why).
    """
    import time

    from distprof.capture.trigger import send, status

    def fail(e: Exception) -> NoReturn:
        raise BadArgument(str(e)) from None  # one line, exit 2 (with --json, one object with errors)

    new = None
    if not show_status:
        if steps is None:
            fail(ValueError("give --steps N (how many steps to capture), or --status to see the requests"))
        try:
            req, new = send(run_dir, steps=steps, ranks=ranks, roles=roles, backend=backend, flags=flags,
                            lead_steps=lead_steps, align=align, start_step=start_step, tag=tag)
        except (ValueError, OSError) as e:  # OSError: the store failed; the message names the path and cause
            fail(e)
        rid = req.id

    def current() -> dict:
        try:
            return status(run_dir, rid, require_run=True)
        except (ValueError, OSError) as e:
            fail(e)

    got = current()
    code = EXIT_OK
    if wait is not None:
        deadline = time.monotonic() + wait
        while not all(r["done"] for r in got["requests"]) and time.monotonic() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))  # polling other processes' files
            got = current()
        code = EXIT_OK if all(r["done"] for r in got["requests"]) else EXIT_SOME_UNREADABLE
    if as_json:
        print_json({"errors": [], **got, **({"id": rid, "new": new} if new is not None else {})}, code)
    if new is not None:
        console.print(Text(f"request {rid} {'sent' if new else 'was already sent (same request)'}"), soft_wrap=True)
        console.print(Text(f"  watch it: distprof trigger {render.plain(run_dir)} --status --id {rid}"), soft_wrap=True)
    if show_status or wait is not None:
        console.print(commands.trigger_status(got))
    raise typer.Exit(code)


cli_watch.register(app, _guarded, console, err)  # `distprof watch` (its code: cli_watch.py)
cli_open.register(app, _guarded, console, err)  # `distprof open` (its code: cli_open.py)
cli_wrap.register(app, _guarded, console, err)  # `distprof wrap` (its code: cli_wrap.py)
cli_hang.register(app, _guarded, console)  # `distprof hang` (its code: cli_hang.py)


def main() -> None:
    app(prog_name="distprof")


if __name__ == "__main__":  # pragma: no cover
    main()
