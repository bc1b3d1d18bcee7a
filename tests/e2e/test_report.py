"""distprof report: one self-contained HTML file, loaded in a real headless Chromium.

Each report is opened from disk in Debian's Chromium through Playwright: no console error, no request but
the file itself (the page opens offline), every plot drawn by plotly.js, the diagnosis present as text, a
screenshot saved. The XSS corpus (names like ``<script>``, ``<img onerror>``, ``</script>`` in kernels,
ops, annotations, the role, file and folder names and the findings) must render as text with no dialog
and nothing executed, checked by a trap installed before the page's own scripts run.
"""

import dataclasses
import gzip
import json
import os
import pathlib

import msgspec
import pytest
from tracekit import DLRM, TRACES, cli, load

from distprof.analysis.analyze import FileResult, Investigation, investigate
from distprof.analysis.diagnose import Finding, Plot, diagnose
from distprof.analysis.records_diag import FindingEvidence, WhatIf
from distprof.report import build_report, render_report

pytestmark = pytest.mark.xdist_group("browser")  # one Chromium for the module on a 2-core machine

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
        "--disable-component-update", "--disable-sync"]
# The report's bound at 1,024 ranks (measured: 5.95 MB, of which plotly.js is 4.8 MB; 8 ranks: 4.86 MB).
MAX_BYTES_1024 = 6_500_000
DIFF = os.path.join(TRACES, "hta", "trace-diff")

EVIL = {  # a real DLRM name -> what the corpus calls it
    "volta_sgemm_128x32_nt": "<script>alert(1)</script>",  # a compute kernel
    "aten::to": "<img src=x onerror=alert(2)>",  # a CPU op
    "## backward ##": '"><svg onload=alert(3)>',  # annotations (phases)
    "DistributedDataParallel.forward": "</script><script>alert(4)</script>",
    "aten::_to_copy": "javascript:alert(5)",
    "aten::empty": "x' onmouseover='alert(6)' &lt;b&gt;",  # an entity must stay the literal text it is
}
EVIL_ROLE = "</script><img src=x onerror=alert(7)>"
EVIL_DIR = "<svg onload=alert(8)>"
EVIL_FILE = "<img src=x onerror=alert(9)>.json"

TRAP = """
window.__trap = [];
['alert', 'confirm', 'prompt', 'print', 'open'].forEach(function (k) {
  window[k] = function () { window.__trap.push(k + ': ' + Array.prototype.join.call(arguments, ' ')); };
});
// Capture phase: also an injected element's failed load (<img src=x onerror=...>) or an uncaught error.
window.addEventListener('error', function (e) { window.__trap.push('error: ' + (e.message || e.target)); }, true);
"""

# Every plot div drawn by plotly.js (it adds .main-svg), and the page's own two scripts only.
PROBE = """() => ({
  plots: document.querySelectorAll('.plot').length,
  drawn: Array.from(document.querySelectorAll('.plot')).filter(d => d.querySelector('.main-svg')).length,
  scripts: document.scripts.length,
  handlers: document.querySelectorAll('[onerror],[onload],[onmouseover]').length,
  trap: window.__trap,
  text: document.body.innerText + '\\n' + Array.from(document.querySelectorAll('svg')).map(s => s.textContent).join('\\n'),
  sections: Array.from(document.querySelectorAll('section.plot-section')).map(s => [s.id, !!s.querySelector('.plot'), !!s.querySelector('.na')]),
  links: Array.from(document.querySelectorAll('#diagnosis a:not(.trace)')).map(a => [a.getAttribute('href'), !!document.getElementById(a.getAttribute('href').slice(1))]),
  traces: Array.from(document.querySelectorAll('#diagnosis a.trace')).map(a => [a.getAttribute('href'), a.protocol]),
})"""


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (a fresh temporary profile). Not starting is a failure: these tests never skip."""
    from playwright.sync_api import sync_playwright

    try:
        pw = sync_playwright().start()
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"Playwright cannot start: {e}")
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
    except Exception as e:  # noqa: BLE001
        pw.stop()
        pytest.fail(f"Chromium ({CHROMIUM}) cannot start: {e}")
    yield b
    b.close()
    pw.stop()


def open_report(browser, html_path, shot, extra=None):
    """Load ``html_path`` with the trap installed; assert the page is clean and offline; return the probe
    (and under ``extra`` what that JS expression gives on the page)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(180_000)  # a bound, not a measure: 2 busy cores took 6-9 s for 1,024 ranks
    console, requests, dialogs = [], [], []
    page.on("console", lambda m: console.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.on("request", lambda r: requests.append(r.url))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.add_init_script(TRAP)
    url = pathlib.Path(html_path).resolve().as_uri()
    page.goto(url, wait_until="load")
    page.wait_for_function("Array.from(document.querySelectorAll('.plot')).every(d => d.querySelector('.main-svg'))")
    got = page.evaluate(PROBE)
    if extra:
        got["extra"] = page.evaluate(extra)
    page.screenshot(path=str(shot), full_page=True)
    page.close()
    assert os.path.getsize(shot) > 10_000
    assert console == [] and dialogs == [] and got["trap"] == []
    assert requests == [url]  # nothing fetched: no CDN, no font, no image
    assert got["plots"] > 0 and got["drawn"] == got["plots"]
    assert got["scripts"] == 2 and got["handlers"] == 0
    assert all(to for _, to in got["links"])  # every finding's link lands on a plot of the page
    assert all(proto == "file:" for _, proto in got["traces"])  # trace links: relative paths, never a scheme
    return got


def outside_plotlyjs(path):
    """The page without the inlined plotly.js bundle (what we wrote ourselves)."""
    import plotly.offline

    text = pathlib.Path(path).read_text()
    js = plotly.offline.get_plotlyjs()
    assert text.count(js) == 1
    return text.replace(js, "")


# ---- real traces ----------------------------------------------------------------------------------------
def test_dlrm_report_in_chromium(browser, tmp_path):
    out = tmp_path / "dlrm.html"
    code, r, err = cli("report", DLRM, "-o", out, "--json")
    assert code == 0, err
    assert r["out"] == str(out) and r["bytes"] == out.stat().st_size and r["files_read"] == 8 and r["errors"] == []
    assert [p["id"] for p in r["plots"]] == [p for p in Plot.ALL if p != Plot.DIFF]
    # 8 GPU ranks of one role: every plot applies but the RL step timeline (it needs several roles), which says so.
    assert all(p["figures"] >= 1 and p["note"] is None for p in r["plots"] if p["id"] != Plot.RL_STEPS)
    assert {p["id"]: p for p in r["plots"]}[Plot.RL_STEPS]["note"].startswith("One role only")
    # The wait matrix as plotly.js drew it: culprit columns and each column's summed waiting.
    matrix = """(() => { const t = document.getElementById('waits-0').data[0];
        return t.x.map((x, j) => [x, t.z.reduce((s, row) => s + (row[j] || 0), 0)]); })()"""
    got = open_report(browser, out, tmp_path / "dlrm.png", extra=matrix)
    assert [s[0] for s in got["sections"]] == [p["id"] for p in r["plots"]]
    if r["findings"]:
        assert all(f["claim"] in got["text"] for f in r["findings"])
    else:
        assert "No findings" in got["text"]
    # Rank 7 holds the others back (stragglers: 35.6 ms of the others' waiting): the matrix's brightest column.
    culprit, ms = max(got["extra"], key=lambda c: c[1])
    assert culprit == "7" and ms == pytest.approx(35.552, abs=0.01)
    assert "ncclKernel_SendRecv_RING_SIMPLE" in got["text"] and "DistributedDataParallel.forward" in got["text"]
    assert "Who waits for whom" in got["text"] and "waited for (culprit rank)" in got["text"]


def test_gloo_run_cpu_only(browser, ddp_run, tmp_path):
    out = tmp_path / "gloo.html"
    code, r, err = cli("report", ddp_run, "-o", out, "--json")
    assert code == 0, err
    plots = {p["id"]: p for p in r["plots"]}
    # No device events: the device plots say so instead of drawing empty axes; the host ones answer.
    assert plots[Plot.KERNELS]["figures"] == 0 and "no device events" in plots[Plot.KERNELS]["note"]
    assert plots[Plot.IDLE]["figures"] == 0 and "no device events" in plots[Plot.IDLE]["note"]
    for p in (Plot.STEP_TIME, Plot.PHASES, Plot.TEMPORAL, Plot.OVERLAP, Plot.WAITS, Plot.OPS):
        assert plots[p]["figures"] >= 1, p
    got = open_report(browser, out, tmp_path / "gloo.png")
    na = {sid for sid, _, note in got["sections"] if note}
    assert na == {Plot.KERNELS, Plot.IDLE, Plot.RL_STEPS}  # one role: no RL step to draw, and the note says so
    assert "Host time per rank" in got["text"] and "train/data" in got["text"] and "Step time, train" in got["text"]
    # Rank 1 sleeps in train/data: whatever diagnose says about it is on the page, linked to its plot.
    assert all(f["claim"] in got["text"] for f in r["findings"])
    assert len(got["links"]) == sum(1 for f in r["findings"] if f["plot"] in {s[0] for s in got["sections"]})


def test_compare_trace_diff(browser, tmp_path):
    out = tmp_path / "diff.html"
    code, r, err = cli("report", os.path.join(DIFF, "control.json.gz"), "--compare", os.path.join(DIFF, "test.json.gz"),
                       "-o", out, "--json")
    assert code == 0, err
    assert r["plots"][-1] == {"id": Plot.DIFF, "figures": 1, "note": None} and r["files_read"] == 2
    got = open_report(browser, out, tmp_path / "diff.png")
    assert got["sections"][-1][0] == Plot.DIFF
    # The largest change HTA's trace_diff pair shows (diff's own first row) is drawn, and named as B vs A.
    d = cli("diff", os.path.join(DIFF, "control.json.gz"), os.path.join(DIFF, "test.json.gz"), "--json")[1]
    assert f"{d['rows'][0]['kind']}: {d['rows'][0]['name']}" in got["text"] and "B minus A" in got["text"]


# ---- 1,024 ranks -----------------------------------------------------------------------------------------
def replicate(inv, n):
    """``inv`` (DLRM's 8 ranks) as a run of ``n`` ranks: each rank's figures copied and renumbered."""
    per = len(inv.summary.ranks)

    def rk(c, r):
        return c * per + r

    def rp(c, p):
        return f"{p}#{c}" if c else p

    cs = range(n // per)
    rep = msgspec.structs.replace
    summary = rep(inv.summary, ranks=[rep(r, rank=rk(c, r.rank), path=rp(c, r.path))
                                      for c in cs for r in inv.summary.ranks])
    steps = rep(inv.steps, steps=[rep(row, ranks=[rep(x, rank=rk(c, x.rank), path=rp(c, x.path))
                                                  for c in cs for x in row.ranks]) for row in inv.steps.steps])
    strag = rep(inv.stragglers,
                wait_matrix=[rep(w, waiter=rk(c, w.waiter), culprit=rk(c, w.culprit))
                             for c in cs for w in inv.stragglers.wait_matrix],
                waits=[rep(w, rank=rk(c, w.rank)) for c in cs for w in inv.stragglers.waits])
    files = [FileResult(dataclasses.replace(f.info, rank=rk(c, f.info.rank), path=rp(c, f.info.path)), f.parts)
             for c in cs for f in inv.run.files]
    facts = [rep(f, rank=rk(c, f.rank), path=rp(c, f.path)) for c in cs for f in inv.files]
    return Investigation(inv.path, dataclasses.replace(inv.run, files=files), summary, steps, strag, facts)


def test_1024_ranks_stay_small_and_open(browser, tmp_path):
    inv = investigate(DLRM, parts=("timeline",))
    big = replicate(inv, 1024)
    assert len(big.summary.ranks) == 1024 and len({x.rank for x in big.steps.steps[0].ranks}) == 1024
    out = tmp_path / "r1024.html"
    # Its findings (one names all 1,024 ranks) each with their trace links and worst-step timeline.
    findings = diagnose(big)
    written = build_report(big, findings, str(out))
    assert findings and all(t is not None and len(t["ranks"]) <= 8 for t in written["timelines"])
    assert written["bytes"] == out.stat().st_size < MAX_BYTES_1024
    small = len(render_report(inv, []).encode())
    assert small < written["bytes"]  # it grows with ranks, and stays bounded
    got = open_report(browser, out, tmp_path / "r1024.png")
    # The wait matrix keeps the top ranks and sums the rest: no 1,024 x 1,024 grid.
    assert "others (" in got["text"]
    assert "1024 ranks" in got["text"]


# ---- untrusted text ----------------------------------------------------------------------------------------
def _evil_run(root):
    """A run directory whose names are the XSS corpus: two real DLRM ranks (0 and 7, the straggler) with
    kernels, ops and annotations renamed, an evil role in the manifests, evil folder and file names."""
    run = root / EVIL_DIR
    for rank, name in ((0, "worker0_step_12.1694128201545.pt.trace.json.gz"),
                       (7, "worker7_step_12.1694128201553.pt.trace.json.gz")):
        doc = load(os.path.join(DLRM, name))
        for e in doc["traceEvents"]:
            if e.get("name") in EVIL:
                e["name"] = EVIL[e["name"]]
        d = run / "role" / f"rank{rank:05d}"
        d.mkdir(parents=True)
        fname = f"{EVIL_DIR}.pt.trace.json.gz"
        with gzip.open(d / fname, "wt") as f:
            json.dump(doc, f)
        (d / "manifest.jsonl").write_text(json.dumps({"role": EVIL_ROLE, "rank": rank, "file": fname}) + "\n")
    (run / EVIL_FILE).write_text("<script>alert(10)</script>")  # not a trace: listed under errors, by name
    return run


def test_xss_corpus_runs_nothing(browser, tmp_path):
    run = _evil_run(tmp_path)
    code, r, err = cli("report", run, "-o", tmp_path / "cli.html", "--json")
    assert code == 1, err  # the evil file is unreadable and named; the two ranks are read
    assert r["files_read"] == 2 and len(r["errors"]) == 1 and EVIL_FILE in r["errors"][0]["path"]

    inv = investigate(str(run), parts=("timeline",))  # (the findings' timelines draw the evil phase names too)
    names = list(EVIL.values()) + [EVIL_ROLE]
    findings = [
        Finding(id="straggler", claim=f"rank 7 of {EVIL_ROLE} arrives last; {EVIL['## backward ##']} takes 4.4 ms",
                cost_us=35552.0, cost_share=0.3, fix=f"look at {EVIL['aten::to']} </script>",
                evidence=FindingEvidence(role=EVIL_ROLE, ranks=[7], steps=[10], names=names),
                what_if=WhatIf(change=EVIL["volta_sgemm_128x32_nt"], saves_us=1e4, saves_per_step_us=1e4, naive_us=1e4,
                               steps=1, then_last_rank=None, upper_bound=False),
                plot=Plot.WAITS),
        Finding(id="evil_link", claim="a finding naming a plot the report does not have", cost_us=1.0,
                fix="none", plot="javascript:alert(11)"),
        Finding(id="evil_files", claim="a finding whose trace files have evil names", cost_us=1.0, fix="none",
                evidence=FindingEvidence(role="role", ranks=[7, 0], steps=[10])),
    ]
    out = tmp_path / "xss.html"
    build_report(inv, findings, str(out))
    got = open_report(browser, out, tmp_path / "xss.png")
    # Every evil string is on the page as the text it is: in the findings, ticks, legends and titles.
    for s in names + [EVIL_DIR, EVIL_FILE, findings[0].claim, findings[0].fix]:
        assert s in got["text"], s
    assert got["links"] == [[f"#{Plot.WAITS}", True]]  # the unknown plot id became no link at all
    # The trace files sit under the report's folder: linked by relative, percent-encoded paths, shown as text.
    evil = "%3Csvg%20onload%3Dalert%288%29%3E"
    assert [h for h, _ in got["traces"]] == [f"{evil}/role/rank{r:05d}/{evil}.pt.trace.json.gz" for r in (7, 0)]
    assert got["text"].count(f"{EVIL_DIR}/role/rank00007/{EVIL_DIR}.pt.trace.json.gz") == 1
    from distprof.report.evidence import relative_href

    assert relative_href(str(tmp_path / "javascript:alert(12).json"), str(out)) == "javascript%3Aalert%2812%29.json"
    assert relative_href("/elsewhere/t.json", str(out)) is None and relative_href("s3://b/t.json", str(out)) is None
    # And in the file itself: outside plotly.js no markup but ours (the JSON writes < > / as \\u escapes).
    ours = outside_plotlyjs(out)
    assert 'id="finding-3-timeline"' in ours  # the evil files' finding draws its step, evil phase names and all
    assert ours.lower().count("<script") == 2 and ours.lower().count("</script") == 2
    assert "<img" not in ours and "<svg" not in ours and 'href="javascript' not in ours


def test_refuses_bad_outputs_before_reading(tmp_path):
    (tmp_path / "dir.html").mkdir()
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    for out, says in ((tmp_path / "dir.html", "is a directory"), (tmp_path / "no" / "r.html", "does not exist"),
                      (fifo, "not a regular file"), ("s3://bucket/r.html", "local file"), ("", "empty")):
        code, text, err = cli("report", DLRM, "-o", out)
        assert code == 2 and says in err and "Traceback" not in err, (out, err)
    assert sorted(os.listdir(tmp_path)) == ["dir.html", "fifo.html"] and os.listdir(tmp_path / "dir.html") == []


def test_nothing_readable_writes_no_page_and_keeps_the_old_one(tmp_path):
    """A report of nothing would say "no findings": a false all-clear, replacing a good report."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rank-0.json").write_text("{not json")
    out = tmp_path / "report.html"
    out.write_text("the good report")
    code, _, err = cli("report", tmp_path / "in", "-o", out)
    assert code == 2 and "was not written" in err and len(err.strip().splitlines()) == 1
    assert out.read_text() == "the good report"
