"""The distprof command line: parses arguments, calls the library, renders with rich."""

from __future__ import annotations

import logging
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
    steps: int = typer.Option(5, "--steps", min=3, help="RL steps to run; the two before the last are profiled."),
) -> None:
    """Run a small RL job (rollout, reference, 2-rank actor) on a local Ray cluster under the profiler."""
    from .demo import rl_job

    out = out or tempfile.mkdtemp(prefix="distprof-demo-")
    with console.status("starting...") as status:
        result = rl_job.run(out, steps=steps, progress=lambda msg: status.update(msg))
    table = Table(title=f"Traces in {result.run_dir}")
    for col in ("role", "rank", "steps", "file", "bytes"):
        table.add_column(col, justify="right" if col in ("rank", "bytes") else "left")
    for rec in sorted(result.files, key=lambda r: (r["role"], r["rank"], r["steps"])):
        table.add_row(rec["role"], str(rec["rank"]), f"{rec['steps'][0]}-{rec['steps'][1]}", rec["file"], f"{rec['bytes']:,}")
    console.print(table)
    console.print(f"mean reward per step: {', '.join(f'{r:.3f}' for r in result.rewards)}")
    if not result.check.ok:
        err.print(f"[red]the run directory is incomplete[/red]; see: distprof check {result.run_dir}", soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"[green]distprof check passed[/green]: {len(result.files)} windows from "
                  f"{len({(f['role'], f['rank']) for f in result.files})} workers, collected through Ray.", soft_wrap=True)
    console.print("Next:")
    for verb in ("summary", "steps", "stragglers"):
        console.print(f"  distprof {verb} {result.run_dir}", soft_wrap=True)
    console.print(f"  distprof merge {result.run_dir} -o merged.json.gz", soft_wrap=True)
    console.print(f"  distprof check {result.run_dir}", soft_wrap=True)
    console.print("  open any trace in https://ui.perfetto.dev (phases: rollout/generate, ref/log_probs, "
                  "actor/update, actor/sync_weights)", soft_wrap=True)


@app.command()
def check(
    run_dir: str = typer.Argument(..., help="A run directory (the save_path of a run, or collect()'s dest)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Say, per role and rank, which expected windows exist and parse, and which are missing or broken.

    Exit code 0 only when the run directory is complete.
    """

    from .check import check_run

    result = check_run(run_dir)
    if as_json:
        _print_json(result.to_dict(), 0 if result.ok else 1)
    table = Table(title=f"distprof check {result.run_dir}")
    for col in ("role", "rank", "steps", "status", "file", "detail"):
        table.add_column(col)
    colors = {"ok": "green", "unlisted": "yellow"}
    for i in result.items:
        steps = f"{i.steps[0]}-{i.steps[1]}" if i.steps else ""
        c = colors.get(i.status, "red")
        table.add_row(i.role, "" if i.rank is None else str(i.rank), steps, f"[{c}]{i.status}[/{c}]", i.file or "", i.detail)
    if result.items:
        console.print(table)
    for p in result.problems:
        err.print(f"[red]problem:[/red] {p}")
    bad = sum(1 for i in result.items if i.status not in ("ok", "unlisted"))
    if result.ok:
        console.print(f"[green]complete[/green]: {len(result.items)} files checked")
    else:
        console.print(f"[red]incomplete[/red]: {bad} of {len(result.items)} entries missing or broken, {len(result.problems)} problems")
    raise typer.Exit(0 if result.ok else 1)


def _read_all(path: str, reduce, workers: Optional[int], ray_address: Optional[str] = None):
    """Read every trace under ``path`` with a progress bar; errors are printed, not raised."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    from .analysis.load import map_traces
    from .analysis.reader import TraceError

    with Progress(TextColumn("reading {task.fields[files]} traces"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("read", total=None, files="")

        def show(p):
            bar.update(task, completed=p.bytes_done, total=p.bytes_total or None, files=f"{p.files_done}/{p.files_total}")

        try:
            results, errors = map_traces(path, reduce, workers=workers, ray_address=ray_address, progress=show)
        except TraceError as e:
            err.print(f"[red]error:[/red] {e}", soft_wrap=True)
            raise typer.Exit(2)
    for e in errors:
        err.print(f"[red]cannot read[/red] {e}", soft_wrap=True)
    if not results:
        raise typer.Exit(2)
    return results, errors


def _print_json(obj, code: int) -> None:
    """--json: one JSON object on stdout, then exit with ``code``."""
    import msgspec

    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    raise typer.Exit(code)


def _us(v: float) -> str:
    return f"{v / 1000:,.3f} ms" if v >= 1000 else f"{v:,.1f} us"


@app.command()
def summary(
    path: str = typer.Argument(..., help="A trace file, a folder of traces, or a run directory (local or fsspec URL)."),
    top: int = typer.Option(15, "--top", min=1, help="Rows per table."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes reading ranks in parallel (default: CPU count)."),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="Read ranks as tasks on this Ray cluster ('local' starts one on loopback)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: kernels, ops, phases, categories, ranks."),
) -> None:
    """Time by GPU kernel and by CPU op, per rank and overall; device busy time (overlap counted once) and idle share."""

    from .analysis.summary import summarize_ranks, summarize_trace

    results, errors = _read_all(path, summarize_trace, workers, ray_address)
    if rank is not None:
        results = [r for r in results if r["rank"] == rank]
        if not results:
            err.print(f"[red]error:[/red] no trace of rank {rank} under {path}", soft_wrap=True)
            raise typer.Exit(2)
    s = summarize_ranks(results, top=top)
    s["errors"] = errors
    if as_json:
        _print_json(s, 1 if errors else 0)
    for title, rows, extra in (("GPU kernels (all ranks)", s["kernels"], None), ("CPU ops (all ranks)", s["ops"], "self_us"),
                               ("Phases: annotations (all ranks; share of traced time)", s["phases"], None)):
        if not rows:
            continue
        t = Table(title=title)
        for col in ("name", "count", "total", *(["self"] if extra else []), "share"):
            t.add_column(col, justify="left" if col == "name" else "right", overflow="ellipsis", max_width=70 if col == "name" else None)
        for r in rows:
            t.add_row(r["name"], f"{r['count']:,}", _us(r["total_us"]), *([_us(r[extra])] if extra else []), f"{r['share']:.1%}")
        console.print(t)
    t = Table(title="Per rank")
    for col in ("role", "rank", "device busy", "idle", "compute", "communication", "memcpy/memset"):
        t.add_column(col, justify="left" if col == "role" else "right")
    for r in s["ranks"]:
        c = r["categories"]
        t.add_row(r["role"] or "", "?" if r["rank"] is None else str(r["rank"]), _us(r["device_busy_us"]),
                  "-" if r["idle_share"] is None else f"{r['idle_share']:.1%}", _us(c.get("compute", 0.0)),
                  _us(c.get("communication", 0.0)), _us(c.get("memcpy", 0.0) + c.get("memset", 0.0)))
    console.print(t)
    unknown = [r["path"] for r in s["ranks"] if r["rank"] is None]
    if unknown:
        err.print(f"[yellow]warning:[/yellow] no rank in distributedInfo, manifest or name for: {', '.join(unknown)}", soft_wrap=True)
    raise typer.Exit(1 if errors else 0)


@app.command()
def stragglers(
    path: str = typer.Argument(..., help="Traces of several ranks: a folder, or a run directory."),
    top: int = typer.Option(10, "--top", min=1, help="Worst collectives to list."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes reading ranks in parallel."),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="Read ranks as tasks on this Ray cluster ('local' starts one on loopback)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: ranks, steps, worst, mismatched."),
) -> None:
    """Match collectives across ranks: who arrives last, how long the others wait for it."""

    from .analysis.stragglers import extract_collectives, match_stragglers

    results, errors = _read_all(path, extract_collectives, workers, ray_address)
    r = match_stragglers(results)
    r["errors"] = errors
    r["worst"] = r["worst"][:top]
    if as_json:
        _print_json(r, 1 if errors else 0)
    if r["matched"] == 0:
        err.print("[yellow]no collective could be matched across ranks[/yellow] (need 2+ ranks with NCCL/RCCL kernels or c10d ops)")
    t = Table(title=f"Stragglers: {r['matched']} collectives matched ({', '.join(r['sources'])})")
    for col in ("role", "rank", "wait caused", "late arrivals", "waited", "collectives"):
        t.add_column(col, justify="left" if col == "role" else "right")
    for row in r["ranks"]:
        t.add_row(row["role"] or "", str(row["rank"]), _us(row["wait_caused_us"]), str(row["late_arrivals"]),
                  _us(row["waited_us"]), str(row["collectives"]))
    console.print(t)
    if r["steps"]:
        t = Table(title="Per step")
        for col in ("role", "step", "collectives", "wait", "slowest rank"):
            t.add_column(col, justify="left" if col == "role" else "right")
        for s in r["steps"]:
            t.add_row(s["role"] or "", "-" if s["step"] is None else str(s["step"]), str(s["collectives"]), _us(s["wait_us"]),
                      "-" if s["slowest_rank"] is None else str(s["slowest_rank"]))
        console.print(t)
    for m in r["mismatched"]:
        err.print(f"[yellow]warning:[/yellow] {m['kind']} in group {m['group']} has different counts per rank {m['counts']}: "
                  "matched up to the smallest", soft_wrap=True)
    raise typer.Exit(1 if errors else 0)


@app.command()
def steps(
    path: str = typer.Argument(..., help="A trace, a folder of traces or a run directory."),
    phases: int = typer.Option(6, "--phases", min=1, help="Phases (annotations) to show per step."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="Read ranks as tasks on this Ray cluster ('local' starts one on loopback)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: steps, each with every rank's breakdown."),
) -> None:
    """Per step and rank: duration, and its breakdown by phase (annotations) and category; the slowest rank."""

    from .analysis.steps import combine_steps, extract_steps

    results, errors = _read_all(path, extract_steps, workers, ray_address)
    d = combine_steps(results)
    d["errors"] = errors
    if as_json:
        _print_json(d, 1 if errors else 0)
    if not d["steps"]:
        err.print("[yellow]no steps in these traces[/yellow]: no ProfilerStep#N ranges (torch writes them when "
                  "profiler.step() is called) and no distprof manifest window for these files")
        raise typer.Exit(1)
    t = Table(title="Steps")
    for col in ("role", "step", "ranks", "slowest", "max", "min", "phases (mean over ranks)"):
        t.add_column(col, justify="left" if col in ("role", "phases (mean over ranks)") else "right")
    for row in d["steps"]:
        ph = ", ".join(f"{k} {_us(v)}" for k, v in list(row["mean_phases"].items())[:phases])
        label = f"{row['window'][0]}-{row['window'][1]} (window)" if row.get("window") else str(row["step"])
        t.add_row(row["role"] or "", label, str(len(row["ranks"])), str(row["slowest_rank"]),
                  _us(row["max_us"]), _us(row["min_us"]), ph)
    console.print(t)
    raise typer.Exit(1 if errors else 0)


@app.command()
def merge(
    path: str = typer.Argument(..., help="Traces of several ranks/roles: a folder or a run directory."),
    out: str = typer.Option(..., "-o", "--out", help="Output trace (.json or .json.gz) for Perfetto or chrome://tracing."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object describing the output."),
) -> None:
    """One trace with every rank and role as its own process track, clocks aligned, every event kept."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from .analysis.merge import merge_traces
    from .analysis.reader import TraceError

    with Progress(TextColumn("merging"), BarColumn(), MofNCompleteColumn(), console=err, transient=True) as bar:
        task = bar.add_task("merge", total=None)
        try:
            r = merge_traces(path, out, progress=lambda done, total: bar.update(task, completed=done, total=total))
        except TraceError as e:
            err.print(f"[red]error:[/red] {e}", soft_wrap=True)
            raise typer.Exit(2)
    if as_json:
        _print_json(r, 1 if r["errors"] else 0)
    for e in r["errors"]:
        err.print(f"[yellow]skipped:[/yellow] {e}", soft_wrap=True)
    console.print(f"merged {r['files']} traces, {r['events']:,} events -> {r['out']} (open in https://ui.perfetto.dev)",
                  soft_wrap=True)
    if r["moved_to_lanes"]:
        console.print(f"{r['moved_to_lanes']:,} events overlapped others on their thread (Perfetto would hide them): "
                      "shown on '(overlaps, lane K)' threads", soft_wrap=True)
    raise typer.Exit(1 if r["errors"] else 0)


@app.command()
def diff(
    a: str = typer.Argument(..., help="Baseline: a trace, a folder of traces or a run directory."),
    b: str = typer.Argument(..., help="Compared: same kinds as A (may be the same path with --rank-b)."),
    rank_a: Optional[int] = typer.Option(None, "--rank-a", help="Only this rank of A."),
    rank_b: Optional[int] = typer.Option(None, "--rank-b", help="Only this rank of B."),
    step_a: Optional[int] = typer.Option(None, "--step-a", help="Only events inside ProfilerStep#N of A."),
    step_b: Optional[int] = typer.Option(None, "--step-b", help="Only events inside ProfilerStep#N of B."),
    top: int = typer.Option(20, "--top", min=1, help="Rows to show."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: rows, totals, only_in_a, only_in_b."),
) -> None:
    """What got slower or faster between two runs, two steps or two ranks: per kernel, op (self time), phase, category."""
    import functools


    from .analysis.diff import diff_summaries
    from .analysis.summary import summarize_trace

    sides = []
    for path, rank, step in ((a, rank_a, step_a), (b, rank_b, step_b)):
        reduce = summarize_trace if step is None else functools.partial(summarize_trace, step=step)
        results, errors = _read_all(path, reduce, workers)
        if rank is not None:
            results = [r for r in results if r["rank"] == rank]
            if not results:
                err.print(f"[red]error:[/red] no trace of rank {rank} under {path}", soft_wrap=True)
                raise typer.Exit(2)
        if step is not None:
            results = [r for r in results if r["step_found"]]
            if not results:
                err.print(f"[red]error:[/red] no ProfilerStep#{step} in the traces under {path}", soft_wrap=True)
                raise typer.Exit(2)
        sides.append(results)
    d = diff_summaries(sides[0], sides[1], top=top)
    if as_json:
        _print_json(d, 0)
    t = Table(title=f"B vs A: GPU kernel time {_us(d['kernel_total_a_us'])} -> {_us(d['kernel_total_b_us'])}")
    for col in ("kind", "name", "A", "B", "change", "ratio"):
        t.add_column(col, justify="left" if col in ("kind", "name") else "right", overflow="ellipsis",
                     max_width=60 if col == "name" else None)
    for r in d["rows"]:
        color = "red" if r["change_us"] > 0 else "green"
        t.add_row(r["kind"], r["name"], _us(r["a_us"]), _us(r["b_us"]), f"[{color}]{r['change_us']:+,.1f} us[/{color}]",
                  "new" if r["ratio"] is None else f"{r['ratio']:.2f}x")
    console.print(t)


def main() -> None:
    app(prog_name="distprof")


if __name__ == "__main__":  # pragma: no cover
    main()
