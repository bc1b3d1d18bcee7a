"""The report's one HTML page: the diagnosis at the top, each finding linked to its plot, then the plots.

Self-contained: plotly.js is inlined once (no CDN, no fetch: the page opens offline and from an
attachment), the figures follow as one JSON object rendered by a few lines of script.

Trace text is untrusted. In HTML every such string goes through :func:`html.escape` (quotes too); the
figures' JSON is written by plotly.py's encoder, which writes ``<``, ``>`` and ``/`` as ``\\u003c``,
``\\u003e``, ``\\u002f``, so no name can close the ``<script>`` it sits in or open a comment there; and the
strings inside the figures were already made text for plotly.js (:func:`.base.label`). The only
link targets written are the fixed :class:`Plot` ids and the findings' trace files as relative paths,
percent-encoded (:mod:`.evidence`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

import plotly
import plotly.offline
from plotly.io.json import to_json_plotly

from distprof.analysis.diagnose import Finding, Plot
from distprof.analysis.records_diag import WhatIf
from distprof.report.base import Section
from distprof.report.evidence import Evidence
from distprof.report.perf import CSS, Block
from distprof.util.safetext import visible

__all__ = ["render"]

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#f6f6f4}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:0 0 6px}
.meta{color:#555;font-size:13px;margin:0 0 12px;overflow-wrap:anywhere}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:14px 16px;margin:14px 0}
.caption{color:#444;font-size:13px;margin:0 0 8px;max-width:980px}
.na{color:#8a5a00;background:#fff8e6;border:1px solid #f0d9a0;border-radius:4px;padding:10px 12px;font-size:14px}
ol.findings{padding-left:22px;margin:6px 0}ol.findings li{margin:0 0 12px}
.claim{font-weight:600}.cost{color:#b02a2a;font-weight:600}
.finding dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;margin:4px 0 0;font-size:13px}
.finding dt{color:#666}.finding dd{margin:0;overflow-wrap:anywhere}
.none{color:#2a7a2a;font-weight:600}
nav{font-size:13px}nav a{margin-right:10px}
.problems li{font-size:13px;overflow-wrap:anywhere}
.plot{min-height:200px}
ul.traces{margin:0;padding-left:16px}ul.traces li{margin:0}
.finding .caption{margin:8px 0 0}.finding .timeline{margin:0 0 4px}
code{font-size:12px;background:#f0f0f0;padding:0 3px;border-radius:3px}
""" + CSS

_TITLES = {Plot.STEP_TIME: "step time", Plot.PHASES: "phases", Plot.TEMPORAL: "temporal breakdown",
           Plot.OVERLAP: "overlap", Plot.WAITS: "who waits for whom", Plot.KERNELS: "top kernels",
           Plot.OPS: "top ops", Plot.IDLE: "device idle", Plot.RL_STEPS: "RL steps",
           Plot.DIFF: "run-to-run diff", Plot.MEMORY: "memory over time"}


def _e(s: Any) -> str:
    return html.escape(visible(s), quote=True)


def _ms(us: float | None) -> str:
    """A duration in the unit that reads best (the figures are µs)."""
    if us is None:
        return "-"
    return f"{us:,.0f} µs" if abs(us) < 1000 else f"{us / 1000:,.1f} ms" if abs(us) < 1e6 else f"{us / 1e6:,.2f} s"


def _what_if(w: WhatIf) -> str:
    """diagnose's what-if (``change``, ``saves_us``, ``saves_per_step_us``, ``steps``, ``naive_us``,
    ``then_last_rank``, ``upper_bound``) in one sentence."""
    saves = w.saves_us
    text = f"{w.change}: " if w.change else ""
    text += f"{'up to ' if w.upper_bound else ''}{_ms(saves)} saved"
    if w.steps and w.saves_per_step_us is not None and w.steps > 1:
        text += f" over {w.steps} steps ({_ms(w.saves_per_step_us)} per step)"
    if w.then_last_rank is not None:
        text += f", then rank {w.then_last_rank} arrives last"
    if w.naive_us is not None and abs(w.naive_us - saves) >= 1:
        text += f" (subtracting naively would say {_ms(w.naive_us)})"
    return text


_CLAIM_SHARE = re.compile(r"\d+(?:\.\d+)?\s?%[^.;%]{0,40}?\bstep", re.IGNORECASE)


def cost_text(f: Finding) -> str:
    """The card's cost: ``cost_us``, and ``cost_share`` unless the claim already states a share of step time (one
    percentage per finding: the claim's own words win, so the card never prints a second, different one)."""
    text = _ms(f.cost_us)
    if f.cost_share is None:
        return text
    share = f"{f.cost_share:.0%}"
    if re.search(rf"(?<![\d.]){re.escape(share)}", f.claim) or _CLAIM_SHARE.search(f.claim):
        return text
    return f"{text} ({share} of step time)"


def _links(ev: Evidence) -> str:
    items = []
    for t in ev.files:
        what = f"rank {t.rank}, {t.steps}: "
        if t.href is not None:
            # href: a relative path, percent-encoded (no scheme can survive), then escaped like any attribute;
            # the text: that path as it reads, escaped.
            items.append(f'<li>{_e(what)}<a class="trace" href="{_e(t.href)}">{_e(unquote(t.href))}</a></li>')
        else:
            items.append(f'<li>{_e(what)}<code>{_e(t.path)}</code></li>')
    if ev.more_files:
        items.append(f"<li>... and {ev.more_files} more</li>")
    return f'<ul class="traces">{"".join(items)}</ul>'


def _finding(i: int, f: Finding, plots: set[str], ev: Evidence | None = None) -> tuple[str, dict[str, Any]]:
    rows = [("cost", f'<span class="cost">{_e(cost_text(f))}</span>')]
    if f.what_if:
        rows.append(("what if", _e(_what_if(f.what_if))))
    rows.append(("fix", _e(f.fix)))
    fe = f.evidence
    evidence = []
    if fe.role:
        evidence.append(f"role {fe.role}")
    if fe.ranks:
        evidence.append("ranks " + ", ".join(map(str, fe.ranks[:16])) + (" ..." if len(fe.ranks) > 16 else ""))
    if fe.steps:
        evidence.append("steps " + ", ".join(map(str, fe.steps[:16])) + (" ..." if len(fe.steps) > 16 else ""))
    if fe.names:
        # C++ kernel names run to thousands of characters; the hovers keep base.NAME_CHARS of them, --json all.
        evidence.append("names: " + "; ".join(n if len(n) <= 300 else n[:299] + "…" for n in map(str, fe.names[:8])))
    if evidence:
        rows.append(("evidence", _e(" · ".join(evidence))))
    if ev is not None and ev.files:
        rows.append(("traces", _links(ev)))
    if ev is not None and ev.open_command:
        rows.append(("open in Perfetto", f'<code class="open">{_e(ev.open_command)}</code>'))
    if f.plot in plots:  # only the report's own ids become links: a finding never writes a target of its own
        rows.append(("shown in", f'<a href="#{f.plot}">{_e(_TITLES.get(f.plot, f.plot))}</a>'))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    figs: dict[str, Any] = {}
    tl = ""
    if ev is not None and ev.timeline is not None:
        div = f"finding-{i}-timeline"
        figs[div] = ev.timeline.to_plotly_json()
        tl = f'<p class="caption">{_e(ev.caption or "")}</p><div class="plot timeline" id="{div}"></div>'
    return (f'<li class="finding" id="finding-{i}" data-id="{_e(f.id)}"><span class="claim">{_e(f.claim)}</span>'
            f"<dl>{dl}</dl>{tl}</li>"), figs


def _problems(env: dict[str, Any]) -> str:
    items = [f"unreadable: {e.get('message') or e.get('path')}" for e in env.get("errors") or []]
    items += [f"read in part: {s.get('path')}"
              + (f" ({'; '.join(map(str, s.get('notes') or []))})" if s.get("notes") else "")
              for s in env.get("salvaged") or []]
    items += [f"conflict: {c.get('path')}: {c.get('reason')}" for c in env.get("conflicts") or []]
    items += [f"warning: {w}" for w in env.get("warnings") or []]
    if not items:
        return ""
    lis = "".join(f"<li>{_e(t)}</li>" for t in items[:200])
    more = f"<li>... and {len(items) - 200} more</li>" if len(items) > 200 else ""
    return f'<section id="problems"><h2>Problems reading the traces</h2><ul class="problems">{lis}{more}</ul></section>'


def _section(s: Section) -> tuple[str, dict[str, Any]]:
    figs = {}
    body = []
    if s.note:
        body.append(f'<p class="na">{_e(s.note)}</p>')
    for k, fig in enumerate(s.figures):
        div = f"{s.id}-{k}"
        figs[div] = fig.to_plotly_json()
        body.append(f'<div class="plot" id="{div}"></div>')
    return (f'<section id="{s.id}" class="plot-section"><h2>{_e(s.title)}</h2><p class="caption">{_e(s.caption)}</p>'
            f'{"".join(body)}</section>'), figs


def _block(b: Block) -> str:
    """A section of tables (:mod:`.perf`: its body is escaped HTML already), after the plots."""
    note = f'<p class="na">{_e(b.note)}</p>' if b.note else ""
    return (f'<section id="{_e(b.id)}" class="table-section"><h2>{_e(b.title)}</h2><p class="caption">'
            f"{_e(b.caption)}</p>{note}{b.html}</section>")


def render(title: str, meta: Iterable[str], findings: list[Finding], sections: list[Section],
           envelope: dict[str, Any], evidence: list[Evidence] | None = None, tables: Iterable[Block] = ()) -> str:
    """The page as a string. ``meta``: lines under the title (plain text, escaped here); ``evidence``: per
    finding, its trace links and worst-step timeline (:func:`.evidence.for_findings`); ``tables``: sections of
    tables after the plots (:func:`.perf.blocks`)."""
    plots = {s.id for s in sections}
    figs: dict[str, Any] = {}
    if findings:
        cards = []
        for i, f in enumerate(findings, 1):
            card, fig = _finding(i, f, plots, evidence[i - 1] if evidence and i <= len(evidence) else None)
            cards.append(card)
            figs.update(fig)
        diag = '<ol class="findings">' + "".join(cards) + "</ol>"
    else:
        diag = ('<p class="none" id="no-findings">No findings: no diagnosis rule fired above its threshold on '
                "these traces.</p>")
    parts = []
    for s in sections:
        html_, sec_figs = _section(s)
        parts.append(html_)
        figs.update(sec_figs)
    tables = list(tables)
    for b in tables:  # FLOPs/MFU, collectives (report/perf.py)
        parts.append(_block(b))
        figs.update({k: f.to_plotly_json() for k, f in b.figures.items()})
    nav = " ".join([f'<a href="#{s.id}">{_e(_TITLES.get(s.id, s.id))}</a>' for s in sections]
                   + [f'<a href="#{_e(b.id)}">{_e(b.title)}</a>' for b in tables])
    js = plotly.offline.get_plotlyjs()
    # An inlined script ends at the first "</script"; plotly.js has none (plotly.py inlines it the same way),
    # and the check keeps it so when the bundle changes.
    if "</script" in js.lower():
        raise RuntimeError(f"plotly {plotly.__version__}'s bundle contains </script: it cannot be inlined")
    data = to_json_plotly(figs)
    config = to_json_plotly({"displaylogo": False, "responsive": True})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}</style>
</head><body><main>
<h1>distprof report</h1>
{"".join(f'<p class="meta">{_e(m)}</p>' for m in meta)}
<nav>{nav}</nav>
<section id="diagnosis"><h2>Diagnosis</h2>{diag}</section>
{_problems(envelope)}
{"".join(parts)}
</main>
<script>{js}</script>
<script>
(function () {{
  var figs = {data}, config = {config};
  Object.keys(figs).forEach(function (id) {{
    Plotly.newPlot(id, figs[id].data, figs[id].layout, config);
  }});
}})();
</script>
</body></html>
"""
