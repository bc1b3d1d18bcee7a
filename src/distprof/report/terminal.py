"""Terminal rendering of the analysis verbs' results (rich). Only the CLI calls this.

Every string that comes from a trace (kernel, op, annotation, role, file name) is put in a table as a
``rich.text.Text``, never as markup, so ``[param|cuda]`` prints as written and ``[/x]`` cannot break
or restyle the output. Tables are :class:`~distprof.report.termfit.FitTable`: they fit the width they are printed at
(no figure cut, long names cut in the middle on a terminal, whole in a file; the rules are in ``termfit``).

Every verb's table reads its typed record (:mod:`distprof.analysis.records`, :mod:`distprof.analysis.records_diag`)
as attributes, and so does ``problems``, the envelope every verb shares (a verb without a record, such as ``merge``,
passes :class:`~distprof.analysis.records.Envelope`).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from msgspec import UNSET, UnsetType
from rich.console import Console
from rich.text import Text

from distprof.analysis.breakdown import CATEGORIES
from distprof.analysis.launch import LAUNCH_BOUND_IDLE_SHARE
from distprof.analysis.records import (
    IdleFigure,
    LaunchFigure,
    LaunchStep,
    NotApplicable,
    ProfilingCost,
    RankStep,
    StepBreakdown,
    StepRow,
    StepsResult,
    StragglersResult,
    SummaryRank,
    SummaryResult,
)
from distprof.analysis.records_diag import DiagnoseResult, DiffResult, WhatIf
from distprof.report import termcoll
from distprof.report.flops_view import flops as flops_tables
from distprof.report.flops_view import steps_flops
from distprof.report.memview import memory as memory_tables
from distprof.report.termfit import BLANK, Col, FitTable, fit_name, say
from distprof.report.units import share, us
from distprof.util.safetext import visible

T = TypeVar("T")

__all__ = [
    "Col",
    "diagnose",
    "diff",
    "files_table",
    "problems",
    "profiling_cost",
    "rl_steps",
    "say",
    "scope_note",
    "share",
    "steps",
    "stragglers",
    "summary",
    "table",
    "us",
]



def _got(v: T | UnsetType) -> T:
    """A field the combine always sets where it is read (a rank's shares, the overall figure's thresholds): unset,
    it is a bug, as the missing ``--json`` key was (KeyError: exit 3)."""
    if v is UNSET:
        raise KeyError("a record field read by the terminal tables is unset")
    return v


def plain(s: Any) -> str:
    """A string from a trace or a path, safe to print: control and bidi characters escaped (``\\x1b``, ``\\n``)."""
    return visible(s)


def _t(s: Any) -> Text:
    """A trace string as plain text (no markup, no control characters), whole: the table it goes in cuts a name
    that does not fit (C++ kernel names run to thousands of characters) in the middle, on a terminal only."""
    return Text(plain(s))


def _rank(r: Any) -> str:
    return "?" if r is None else str(r)


def _kind(c: str, left: tuple[str, ...]) -> str:
    """A column's layout by its name: names cut or fold, phases go under the row, role/step/rank are keys,
    other left-aligned columns are prose, the rest figures (never cut)."""
    return "line" if c == "phases" else "name" if c in ("name", "file") else "key" if c in ("role", "rank", "step") \
        else "text" if c in left else "num"


def _table(title: str | Text, cols: list[str], left: tuple[str, ...] = ("name", "role"),
           empty: tuple[str, ...] = BLANK) -> FitTable:
    """A table of figures: ``left`` columns are text, the others figures; a figure column whose every cell is in
    ``empty`` is left out (and named under the table)."""
    return FitTable(title, [Col(c, _kind(c, left), empty=BLANK if _kind(c, left) == "key" else empty,
                                once=c == "role") for c in cols])


def table(title: str | Text, cols: list[tuple[str, str] | str]) -> FitTable:
    """A table for the CLI's other verbs: each column ``(name, kind)`` (kinds in ``termfit.Col``) or a name
    (a key for role/rank, else text)."""
    return FitTable(title, [Col(*c) if isinstance(c, tuple) else Col(c, "key" if c in ("role", "rank") else "text",
                                                                      once=c == "role") for c in cols])


def files_table(run_dir: str, files: list[dict[str, Any]]) -> FitTable:
    """The trace files a run wrote (the demo's first table): role, rank, steps, file, bytes."""
    t = table(Text(f"Traces in {plain(run_dir)}"),
              ["role", "rank", ("steps", "fixed"), ("file", "name"), ("bytes", "num")])
    for rec in sorted(files, key=lambda r: (r["role"], r["rank"], r["steps"])):
        t.add_row(_t(rec["role"]), str(rec["rank"]), f"{rec['steps'][0]}-{rec['steps'][1]}", _t(rec["file"]),
                  f"{rec['bytes']:,}")
    return t


class Problems(Protocol):
    """What ``problems`` reads: the envelope fields of a verb's record (each unset where the verb has none)."""
    errors: list[dict[str, Any]] | UnsetType
    salvaged: list[dict[str, Any]] | UnsetType
    conflicts: list[dict[str, Any]] | UnsetType
    warnings: list[str]


def problems(err: Console, result: Problems) -> None:
    """Errors, salvaged files, conflicts and warnings, one line each, on stderr."""
    for e in result.errors or []:
        say(err, Text.assemble(("cannot read ", "red"), plain(e["message"])), hang=2)
    for s in result.salvaged or []:
        notes = "; ".join(s.get("notes") or []) or "truncated"
        say(err, Text.assemble(("salvaged ", "yellow"), plain(f"{s['path']}: read in part ({notes}); "
                                                              "its figures cover only what could be read")), hang=2)
    for c in result.conflicts or []:
        say(err, Text.assemble(("conflict ", "yellow"), plain(f"{c['path']}: {c['reason']}")), hang=2)
    for w in result.warnings or []:
        say(err, Text.assemble(("warning ", "yellow"), plain(w)), hang=2)


def scope_note(result: SummaryResult) -> Text | None:
    """Which time the figures cover, and how much work lies outside the steps."""
    scope = result.scope or {}
    outside = result.outside_steps or {}
    if scope.get("steps_only"):
        which = (f"steps {','.join(map(str, scope['steps']))}" if scope.get("steps")
                 else "work inside ProfilerStep ranges")
        return Text(f"Figures cover {which} only.")
    if outside.get("device_us") or outside.get("op_us"):
        total_dev = sum(result.categories.values())
        part = f"{outside['device_us'] / total_dev:.1%} of device time" if total_dev and outside.get("device_us") else \
            f"{us(outside.get('op_us'))} of CPU op time"
        return Text(f"Figures cover the whole trace; {part} lies outside ProfilerStep ranges "
                    "(--steps-only leaves it out, as HolisticTraceAnalysis does).")
    return None


def summary(console: Console, s: SummaryResult) -> None:
    note = scope_note(s)
    if note is not None:
        say(console, note)
    if not s.ranks and s.memory:  # memory snapshots alone (no trace): their answers are all there is
        memory_tables(console, s)
        return
    _top_tables(console, s)
    _device_ranks(console, s.ranks)
    _host_ranks(console, s.ranks)
    _idle_table(console, s)
    _launch_table(console, s)
    _breakdown(console, s.step_breakdown)
    termcoll.collectives(console, s.collectives or [])
    profiling_cost(console, s.profiling_cost)
    flops_tables(console, s)  # FLOPs, TFLOP/s, MFU and roofline points (traces with shapes), or why there are none
    memory_tables(console, s)  # peak, its moment, live blocks, OOM (snapshots, profile_memory traces)


def _top_tables(console: Console, s: SummaryResult) -> None:
    """The kernels, CPU ops and phases over all ranks, each table when the run has any."""
    if s.kernels:
        t = _table("Device kernels, memcpy, memset (all ranks; share of device time)",
                   ["name", "count", "total", "share"])
        for k in s.kernels:
            t.add_row(_t(k.name), f"{k.count:,}", us(k.total_us), share(k.share))
        console.print(t)
    if s.ops:
        t = _table("CPU ops (all ranks; share of self time)", ["name", "count", "total", "self", "share"])
        for o in s.ops:
            t.add_row(_t(o.name), f"{o.count:,}", us(o.total_us), us(o.self_us), share(o.share))
        console.print(t)
    if s.phases:
        t = _table("Phases: annotations (all ranks; wall = time open; share of traced time; phases nest)",
                   ["name", "count", "wall", "self", "share"])
        for p in s.phases:
            t.add_row(_t(p.name), f"{p.count:,}", us(p.wall_us), us(p.self_us), share(p.share))
        console.print(t)


def _device_ranks(console: Console, ranks: list[SummaryRank]) -> None:
    """Per rank, its device time by kind (when any rank has device events)."""
    if not any(r.temporal and r.temporal.device for r in ranks):
        return
    t = _table("Per rank: device time (share of the device span)",
               ["role", "rank", "span", "compute", "communication", "memory", "idle", "comm overlapped"])
    for r in ranks:
        d = r.temporal.device if r.temporal else None
        o = r.overlap.device if r.overlap else None
        if d is None:
            t.add_row(_t(r.role), _rank(r.rank), "no device events", "", "", "", "", "")
            continue
        t.add_row(_t(r.role), _rank(r.rank), us(d.span_us), share(_got(d.compute_share)),
                  share(_got(d.communication_share)), share(_got(d.memory_share)), share(_got(d.idle_share)),
                  share(o.share) if o else "-")
    console.print(t)


def _host_ranks(console: Console, ranks: list[SummaryRank]) -> None:
    """Per rank, its host time by kind and its threads' busy time."""
    t = _table("Per rank: host time (share of the traced host time; in phases: inside an annotated phase that "
               "runs no traced op, busy in user code, not idle)",
               ["role", "rank", "traced", "compute", "communication", "in phases", "idle", "main thread busy",
                "comm threads busy", "comm overlapped"])
    for r in ranks:
        h = r.temporal.host if r.temporal else None
        o = r.overlap.host if r.overlap else None
        if h is None:
            t.add_row(_t(r.role), _rank(r.rank), "no host events", *[""] * 7)
            continue
        th = h.threads or {}
        phases = h.in_phases_share or 0.0  # part of idle_share (which keeps its meaning in --json)
        t.add_row(_t(r.role), _rank(r.rank), us(h.span_us), share(_got(h.compute_share)),
                  share(_got(h.communication_share)), share(phases), share(max(_got(h.idle_share) - phases, 0.0)),
                  us(th.get("main")),
                  us(th.get("communication")), share(o.share) if o else "-")
    console.print(t)


def _breakdown(console: Console, b: StepBreakdown | UnsetType | None) -> None:
    """The average step's TensorBoard-style breakdown (when the run has steps)."""
    if not b:
        return
    t = _table("Average step, TensorBoard-style breakdown (all ranks; share of the step)",
               ["duration", *(c.replace("_", " ") for c in CATEGORIES)], empty=(*BLANK, "0%"))
    t.add_row(us(b.dur_us), *[f"{_part(b, k) / b.dur_us:.0%}" if b.dur_us else "-" for k in CATEGORIES])
    console.print(t)


def _part(b: StepBreakdown, category: str) -> float:
    """A breakdown's µs in one of :data:`~distprof.analysis.breakdown.CATEGORIES` (its fields, named alike)."""
    return float(getattr(b, category))



def profiling_cost(console: Console, rows: list[ProfilingCost] | None, most: int = 8) -> None:
    """One paragraph per rank whose manifest timed its windows (``most`` of them): how much slower its profiled
    steps ran (only when the baseline is reliable, else why there is no figure), and how long closing its
    windows held it."""
    rows = rows or []
    for r in rows[:most]:
        who = f"{plain(r.role)} rank {_rank(r.rank)}" if r.role else f"rank {_rank(r.rank)}"
        if r.inflation is not None and r.reliable:
            n, w = r.baseline_steps, r.windows
            how = f"{abs(r.inflation):.0%} {'slower' if r.inflation >= 0 else 'faster'}"
            text = (f"Profiling's own cost, {who}: profiled steps ran {how} than the {'one' if n == 1 else n} "
                    f"unprofiled step{'' if n == 1 else 's'} in steady state before them (median "
                    f"{_seconds(r.profiled_s)} vs {_seconds(r.baseline_s)}, {w} window{'' if w == 1 else 's'}).")
        else:
            text = f"Profiling's own cost, {who}: no reliable baseline: {plain(r.reason or 'not recorded')}."
        if r.export_s is not None:
            k = r.export_windows or 1
            text += (f" Closing the window held {who} for {_seconds(r.export_s)}" if k == 1 else
                     f" Closing its {k} windows held {who} for up to {_seconds(r.export_s)} each, "
                     f"{_seconds(r.export_total_s)} in all") + " (no step time includes it)."
        say(console, Text(text))
    if len(rows) > most:
        say(console, Text(f"Profiling's own cost of {len(rows) - most} more ranks: in --json (profiling_cost)."))


def _seconds(v: float | None) -> str:
    return us(None if v is None else v * 1e6)


def _not_applicable(fig: IdleFigure | LaunchFigure | NotApplicable | UnsetType | None) -> str | None:
    """The table's words for a figure that means nothing here (None when it does)."""
    if not fig:
        return "-"
    if fig.applicable:
        return None
    return f"not applicable ({fig.reason if isinstance(fig, NotApplicable) else 'no device events'})"


def _idle_table(console: Console, s: SummaryResult) -> None:
    """Per rank: device idle time split by cause (HolisticTraceAnalysis's idle time breakdown)."""
    overall = s.idle
    if not overall:
        return
    if not isinstance(overall, IdleFigure) or not overall.applicable:
        say(console, Text(f"Device idle by cause: {_not_applicable(overall)}"))
        return
    t = _table(f"Per rank: device idle by cause (idle: share of the device span; causes: share of idle; "
               f"kernel wait: gaps < {_got(overall.kernel_wait_below_us):g} us)",
               ["role", "rank", "idle", "host wait", "kernel wait", "other", "stream with most host wait (its own)"])
    for r in s.ranks:
        f = r.idle
        na = _not_applicable(f)
        if na or not isinstance(f, IdleFigure):
            t.add_row(_t(r.role), _rank(r.rank), na, "", "", "", "")
            continue
        worst = max(_got(f.streams), key=lambda x: x.host_wait_us, default=None)
        t.add_row(_t(r.role), _rank(r.rank), f"{us(f.idle_us)} ({share(f.idle_share)})",
                  share(f.host_wait_share), share(f.kernel_wait_share), share(f.other_share),
                  f"stream {worst.stream}: {us(worst.host_wait_us)}" if worst and worst.host_wait_us else "-")
    console.print(t)


def _launch_table(console: Console, s: SummaryResult) -> None:
    """Per rank: kernel launch statistics (HolisticTraceAnalysis's launch stats) and launch-bound steps."""
    overall = s.launch
    if not overall:
        return
    if not isinstance(overall, LaunchFigure) or not overall.applicable:
        say(console, Text(f"Kernel launches: {_not_applicable(overall)}"))
        return
    th = _got(overall.thresholds)
    t = _table(f"Per rank: kernel launches (delay: device start - call end, outlier > "
               f"{th.launch_delay_cutoff_us:g} us; short: device time < call time)",
               ["role", "rank", "launches", "delay mean", "p95", "max", "outliers", "call / device", "short",
                "launch-bound steps"], left=("role", "launch-bound steps"))
    for r in s.ranks:
        f = r.launch
        na = _not_applicable(f)
        if na or not isinstance(f, LaunchFigure):
            t.add_row(_t(r.role), _rank(r.rank), na, *[""] * 7)
            continue
        d = f.delay_us
        bound = _got(f.launch_bound_steps)
        t.add_row(_t(r.role), _rank(r.rank), f"{f.launches:,}", us(d.mean), us(d.p95), us(d.max),
                  f"{f.delay_outliers:,}", f"{us(f.cpu_us.mean)} / {us(f.device_us.mean)}",
                  share(f.short_share),
                  (", ".join(f"#{b}" for b in bound[:8]) + (" ..." if len(bound) > 8 else "")) or "-")
    console.print(t)


def _step_idle(x: RankStep) -> str:
    f = x.idle
    if not isinstance(f, IdleFigure) or not f.applicable:
        return "-"
    bound = x.launch.launch_bound if isinstance(x.launch, LaunchStep) else None
    return f"{share(f.idle_share)} (host {f.host_wait_share:.0%})" + (" LB" if bound else "")


def _step(step: Any) -> str:
    """A step as the tables show it: ``N``, ``A-B (window)`` for a capture window without step markers, or ``-``."""
    if step is None:
        return "-"
    if isinstance(step, (list, tuple)):
        return f"{step[0]}-{step[1]} (window)"
    return str(step)


def _label(row: StepRow) -> str:
    return _step(row.window if row.window else row.step)


def _step_breakdown_table(console: Console, d: StepsResult) -> None:
    """Per step, over its ranks: the TensorBoard-style breakdown and the comm/compute overlap (each rank's own
    figures are in --json)."""
    rows = [row for row in d.steps if any(x.breakdown for x in row.ranks)]
    if not rows:
        return
    t = _table("Per step, mean over its ranks: TensorBoard-style breakdown (share of the step) and communication "
               "overlapped by compute", ["role", "step", "duration", *(c.replace("_", " ") for c in CATEGORIES),
                                         "comm overlapped"], empty=(*BLANK, "0%"))
    for row in rows:
        figs = [x.breakdown for x in row.ranks if x.breakdown]
        dur = sum(f.dur_us for f in figs)
        over = [o for x in row.ranks if x.overlap for o in (x.overlap.device, x.overlap.host) if o]
        comm = sum(o.communication_us for o in over)
        t.add_row(_t(row.role), _label(row), us(dur / len(figs)),
                  *[f"{sum(_part(f, c) for f in figs) / dur:.0%}" if dur else "-" for c in CATEGORIES],
                  share(sum(o.overlapped_us for o in over) / comm) if comm else "-")
    console.print(t)


def steps(console: Console, d: StepsResult, phases: int = 4, max_ranks: int = 16) -> None:
    if not d.steps:
        return
    t = _table("Steps: per rank (busy = duration - time waiting for peers; * holds the others back: "
               "caused the most waiting)",
               ["role", "step", "rank", "duration", "waited", "busy", "caused", "device idle", "phases"],
               left=("role", "phases"))
    for row in d.steps:
        label = _label(row)
        ranks = row.ranks
        shown = ranks if len(ranks) <= max_ranks else \
            sorted(ranks, key=lambda x: (-x.wait_caused_us, -x.busy_us))[:max_ranks // 2]
        for x in shown:
            mark = " *" if x.rank == row.slowest_rank and len(ranks) > 1 else ""
            ph = Text(", ").join([Text(f"{plain(k)} {us(v)}") for k, v in list(x.phases.items())[:phases]])
            t.add_row(_t(row.role), label, _rank(x.rank) + mark,
                      us(x.dur_us), us(x.waited_us), us(x.busy_us), us(x.wait_caused_us), _step_idle(x), ph)
        if len(shown) < len(ranks):
            t.add_row(_t(row.role), label, f"... {len(ranks) - len(shown)} more", "", "", "", "", "", "")
        t.add_section()
    console.print(t)
    steps_flops(console, d)  # achieved TFLOP/s and MFU per step (traces with shapes), or why there are none
    _step_breakdown_table(console, d)
    rl_steps(console, d)
    profiling_cost(console, d.profiling_cost)
    bound = [(row, row.launch_bound_ranks) for row in d.steps if row.launch_bound_ranks]
    if bound:
        listed = "; ".join(f"step {row.step}: rank{'s' if len(r) > 1 else ''} {','.join(map(_rank, r))}"
                           for row, r in bound[:10]) + (" ..." if len(bound) > 10 else "")
        say(console, Text(f"LB = launch-bound ({listed}): device idle >= {LAUNCH_BOUND_IDLE_SHARE:.0%} of the step's "
                          "device span, at least half of it waiting for the CPU, and at least half of that wait "
                          "spent issuing work (launch calls, their ops, the Python between them). "
                          "Fewer, larger kernels (fusion, torch.compile, CUDA graphs) help; faster kernels do not."))
    elif any(x.idle and x.idle.applicable for row in d.steps for x in row.ranks):
        say(console, Text("device idle: share of the step's device span idle (host: share of that idle spent "
                          "waiting for the CPU to launch work)."))


def stragglers(console: Console, err: Console, r: StragglersResult) -> None:
    if r.matched == 0:
        say(err, Text("no collective could be matched across ranks (need 2+ ranks of one role with collective kernels "
                      "or c10d ops in the same steps)", style="yellow"))
    t = _table(f"Stragglers: {r.matched} collectives matched ({', '.join(r.sources)}); "
               "waits are unions: overlapping collectives count once",
               ["role", "rank", "wait caused", "late arrivals", "waited", "collectives"])
    for row in r.ranks:
        t.add_row(_t(row.role), str(row.rank), us(row.wait_caused_us), str(row.late_arrivals),
                  us(row.waited_us), str(row.collectives))
    console.print(t)
    if r.steps:
        t = _table("Per step", ["role", "step", "collectives", "wait (all ranks)", "slowest rank"])
        for s in r.steps:
            t.add_row(_t(s.role), _step(s.step), str(s.collectives), us(s.wait_us),
                      "-" if s.slowest_rank is None else str(s.slowest_rank))
        console.print(t)
    if r.worst:
        t = _table("Collectives that cost the most waiting",
                   ["role", "step", "group", "kind", "index", "last rank", "wait caused", "longest wait"],
                   left=("role", "group", "kind"))
        for w in r.worst:
            t.add_row(_t(w.role), _step(w.step), _t(w.group), _t(w.kind), str(w.index),
                      str(w.last_rank), us(w.wait_caused_us), us(w.max_wait_us))
        console.print(t)
    for m in r.mismatched:
        say(err, Text(plain(f"warning: {m.kind} in group {m.group} (step {_step(m.step)}) has different "
                            f"counts per rank {m.counts}: matched up to the smallest"), style="yellow"), hang=2)


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _change(a: float | None, b: float | None) -> str:
    """B over A as a ratio; ``new`` when A had none."""
    return _ratio(b / a) if a and b is not None else "new" if b else "-"


def diff_headlines(d: DiffResult) -> list[str]:
    """What the diff's table is headed by, one line each, only for what the runs have: the median step per role,
    and device kernel time when either side has device work."""
    lines = []
    for r in d.step_time:
        who = f"{plain(r.role)}: " if r.role else ""
        lines.append(f"Step time, {who}median {us(r.a_median_us)} -> {us(r.b_median_us)} "
                     f"({_ratio(r.ratio)}; {r.a_steps} -> {r.b_steps} rank-steps)")
    if d.kernel_total_a_us or d.kernel_total_b_us:
        if d.compares == "per_step":
            a, b = d.kernel_per_step_a_us, d.kernel_per_step_b_us
            lines.append(f"Device kernel time per step and rank: {us(a)} -> {us(b)} ({_change(a, b)})")
        else:
            a, b = d.kernel_total_a_us, d.kernel_total_b_us
            lines.append(f"Device kernel time in total: {us(a)} -> {us(b)} ({_change(a, b)})")
    return lines


def diff(console: Console, d: DiffResult) -> None:
    """The diff's headlines, then one row per name: A and B per step (or in total: see ``compares``)."""
    per_step = d.compares == "per_step"
    for line in diff_headlines(d):
        console.print(Text(line))  # wrapped at the terminal's width
    title = (f"B vs A, mean per step and rank ({d.steps.a} vs {d.steps.b} steps)" if per_step
             else "B vs A, totals (no per-step means: see the warning)")
    t = _table(title, ["kind", "name", "A", "B", "change", "ratio"], left=("kind", "name"))
    for r in d.rows:
        change_us = r.change_per_step_us if per_step and r.change_per_step_us is not None else r.change_us
        color = "red" if change_us > 0 else "green"
        change = ("+" if change_us > 0 else "-" if change_us < 0 else "") + us(abs(change_us))
        a, b = (r.a_per_step_us, r.b_per_step_us) if per_step else (r.a_us, r.b_us)
        t.add_row(r.kind, _t(r.name), us(a), us(b), Text(change, style=color),
                  _ratio(r.ratio) if r.ratio is not None else _change(a, b))
    console.print(t)


def _what_if(w: WhatIf | None) -> str | None:
    """A finding's what-if in words: the change, what it saves on the step's path, and the naive figure."""
    if not w:
        return None
    steps = w.steps or 0
    text = f"if {w.change}, each step gets {'up to ' if w.upper_bound else ''}{us(w.saves_per_step_us)} " \
           f"shorter" + (f" ({us(w.saves_us)} over {steps} steps)" if steps > 1 else "")
    if w.naive_us is not None and w.naive_us > w.saves_us * 1.05 + 1:
        text += f" (subtracting the time alone would say {us(w.naive_us)}"
        text += f"; rank {_rank(w.then_last_rank)} then arrives last)" if w.then_last_rank is not None else ")"
    return text


def diagnose(console: Console, d: DiagnoseResult) -> None:
    """Findings ranked by the step time they cost: claim, cost, what-if, fix (claims carry trace names: plain text)."""
    findings = d.findings
    a = d.analysed
    n_steps, n_ranks = a.steps, a.ranks
    seen = f"{n_steps} step{'' if n_steps == 1 else 's'} of {n_ranks} rank{'' if n_ranks == 1 else 's'} analysed" + \
        ("" if a.device else "; no device events, so only the host rules apply")
    if not findings:
        say(console, Text(f"No problems found above the thresholds ({seen}).", style="green"))
        return
    say(console, Text(f"Diagnosis: {len(findings)} finding{'s' if len(findings) > 1 else ''}, ranked by the step time "
                      f"they cost ({seen})", style="bold"))
    for i, f in enumerate(findings, 1):
        cost = us(f.cost_us) + (f" ({share(f.cost_share)} of step time)" if f.cost_share is not None else "")
        say(console, Text.assemble((f"{i}. {f.id}", "bold"), "  costs ", (cost, "red" if i == 1 else "yellow")),
            hang=3)
        say(console, Text.assemble("   ", plain(f.claim)))
        w = _what_if(f.what_if)
        if w:
            say(console, Text.assemble("   ", ("what-if: ", "cyan"), plain(w)))
        say(console, Text.assemble("   ", ("fix: ", "green"), plain(f.fix)))
        ev = f.evidence
        names = ", ".join(fit_name(console, plain(n), min(60, max(24, console.width - 16))) for n in ev.names[:3])
        where = "; ".join(p for p in (
            f"role {plain(ev.role)}" if ev.role else "",
            (f"ranks {', '.join(map(_rank, ev.ranks[:8]))}{' ...' if len(ev.ranks) > 8 else ''}"
             if ev.ranks else ""),
            (f"steps {', '.join(map(_step, ev.steps[:8]))}{' ...' if len(ev.steps) > 8 else ''}"
             if ev.steps else ""),
            f"names {names}" if names else "",
            f"plot {f.plot}" if f.plot else "") if p)
        if where:
            say(console, Text.assemble("   ", ("evidence: ", "dim"), (where, "dim")))


def rl_steps(console: Console, d: StepsResult) -> None:
    """One table: per RL step and role its busy, idle, critical-path and overlapped time and what-if saving;
    under it each step's critical path."""
    rl = d.rl_steps or []
    if not rl:
        return
    t = _table("RL steps: per role (idle = waiting for another role; overlap = busy while another role is; "
               "saves = the step's saving if this role took its median step's time, on the path)",
               ["step", "role", "duration", "busy", "idle", "on path", "overlap", "saves"], left=("role",))
    for s in rl:
        saves = {w.role: w.saves_us for w in s.what_if}
        for j, r in enumerate(s.roles):
            t.add_row(str(s.step), _t(r.role), us(s.duration_us) if j == 0 else "", us(r.busy_us),
                      us(r.idle_us), us(r.on_path_us), us(r.overlapped_us), us(saves.get(r.role)))
        t.add_section()
    console.print(t)
    for s in rl:
        best = s.what_if[0] if s.what_if else None
        line = f"step {s.step}: path {' > '.join(plain(r) for r in s.critical_path)}"
        if best and best.saves_us > 0:
            line += f"; {plain(best.role)} at its median saves {us(best.saves_us)}"
        for e in s.engine or []:
            line += (f"; {plain(e.role)}: {e.engine_iterations} iterations, prefill {us(e.prefill_us)}, "
                     f"decode {us(e.decode_us)}")
        say(console, Text(line))
