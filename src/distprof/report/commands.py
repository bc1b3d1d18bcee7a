"""Terminal output of the commands that are not analyses: ``validate`` (a config translated) and
``trigger --status`` (who answered a capture request). Every string from a config or a request file is untrusted
input and goes in as ``Text``, never markup. The CLI prints what these return."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from rich.text import Text

from distprof.config.dialects.source import MISSING, short
from distprof.report import terminal as render
from distprof.report.termfit import FitTable

__all__ = ["trigger_status", "validation"]

_STATE_COLOURS = {"captured": "green", "accepted": "cyan", "skipped": "yellow", "refused": "red"}


def trigger_status(got: dict) -> FitTable | str:
    """One row per (request, role, rank) answer; the strings come from files others wrote: Text only."""
    table = render.table(Text(f"distprof trigger {render.plain(got['run_dir'])} --status"),
                         [("request", "key"), ("start", "num"), "role", "rank", ("state", "fixed"), ("steps", "fixed"),
                          "detail"])
    for r in got["requests"]:
        start = "" if r["start_step"] is None else str(r["start_step"])
        if not r["acks"]:
            table.add_row(Text(render.plain(r["id"])), start, "", "", Text("no answer yet", style="dim"), "", "")
        for a in r["acks"]:
            st = a.get("steps")
            table.add_row(Text(render.plain(r["id"])), start, Text(render.plain(a["role"])), str(a["rank"]),
                          Text(render.plain(a["state"]), style=_STATE_COLOURS.get(a["state"], "")),
                          f"{st[0]}-{st[1]}" if st else "", Text(render.plain(a.get("detail", ""))))
    return table if got["requests"] else "no trigger requests"


def validation(t: Any, file: str) -> tuple[list[Any], list[Text]]:
    """validate's output for the Translation ``t`` of ``file``: what goes to stdout (title, the resulting config,
    the roles, the mapping and what was dropped, the verdict) and the error and warning lines for stderr."""
    what = "distprof config" if t.dialect == "distprof" else f"{t.dialect} config"
    where = f", section {t.section}" if t.section else ""
    out: list[Any] = [Text(f"{render.plain(file)}: {what}{render.plain(where)}", style="bold")]
    if t.profiler_config is not None:
        body = yaml.safe_dump(t.profiler_config.model_dump(mode="json", exclude_defaults=True), sort_keys=False,
                              default_flow_style=None, width=100).rstrip()
        out.append(Text("Resulting distprof config (settings that differ from the defaults):", style="bold"))
        out += [_txt(line) for line in (body or "{}").splitlines()]
        out.append(_roles_table(t, short))
    if t.dialect != "distprof" and t.mapping:
        table = render.table("Mapping, field by field", [("source field", "name"), "value", ("distprof field", "name"),
                                                         "becomes", "note"])
        for m in t.mapping:
            table.add_row(_txt(m.source), _txt(short(m.value)), _txt(m.target),
                          _txt("-" if m.result is MISSING else short(m.result)), _txt(m.note))
        out.append(table)
    if t.dropped:
        table = render.table("Dropped (not honoured)", [("source field", "name"), "value", "why"])
        for d in t.dropped:
            table.add_row(_txt(d.source), _txt(short(d.value)), _txt(d.reason))
        out.append(table)
    errs = [Text.assemble(("error: ", "red"), render.plain(e)) for e in t.errors]
    errs += [Text.assemble(("warning: ", "yellow"), render.plain(w)) for w in t.warnings]
    out.append(_validation_verdict(t))
    return out, errs


def _txt(v: Any) -> Text:
    return Text(render.plain(v))


def _roles_table(t: Any, short: Callable[[Any], str]) -> FitTable:
    """validate's table of each role's captures (``short`` renders a config value in one short line)."""
    roles = render.table("Roles", [("role", "key"), ("captures", "fixed"), ("backend", "fixed"), "ranks", "steps",
                                   "options"])
    for role, s in t.roles().items():
        steps = short(s["steps"]) if s["steps"] is not None else f"schedule {short(s['schedule'])}"
        opts = s.get("torch") or s.get(s["backend"]) or {}
        if s.get("discrete"):
            opts = {"discrete": True, **opts}
        roles.add_row(_txt(role), Text("yes", style="green") if s["captures"] else Text("no", style="yellow"),
                      _txt(s["backend"]), _txt(short(s["ranks"])), _txt(steps), _txt(short(opts)))
    return roles


def _validation_verdict(t: Any) -> Text:
    """validate's last line: invalid, valid but capturing less than asked, or valid; unknown keys counted."""
    unknown = sum(d.unknown for d in t.dropped)
    ignored = f"; {unknown} unknown key{'s' if unknown != 1 else ''} ignored (see Dropped)" if unknown else ""
    if not t.ok:
        n = len(t.errors)
        return Text(f"invalid: {n} error{'s' if n != 1 else ''}{ignored}", style="red")
    if t.warnings:
        return Text(f"valid, but it captures less than it asks for (see the warnings){ignored}", style="yellow")
    return Text(f"valid{ignored}", style="yellow" if unknown else "green")
