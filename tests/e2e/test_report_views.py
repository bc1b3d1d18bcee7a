"""What the report shows, checked in real headless Chromium on the figures plotly.js drew (``gd.data`` /
``gd.layout`` of each plot div) and on the rendered page (element boxes, visible text).

Traces: the session's real 2-rank DDP job over gloo (``ddp_run``: rank 1 sleeps ``SLOW_S`` in train/data, a phase
that runs no op, every step), DLRM's 8 GPU ranks, and small synthetic run directories written here.
"""

import os
import shutil
from urllib.parse import unquote

import pytest
from conftest import SLOW_S
from test_report import browser, open_report  # noqa: F401  (the module's Chromium, and the clean-page checks)
from tracekit import DLRM, X, write

from distprof.analysis import analyze
from distprof.analysis.diagnose import Finding, Plot
from distprof.analysis.records_diag import FindingEvidence
from distprof.report import build_report, render_report, write_report

pytestmark = pytest.mark.xdist_group("browser")

PLOTS = """(() => { const out = {};
  document.querySelectorAll('.plot').forEach(d => { out[d.id] = {
      data: d.data.map(t => ({name: t.name, x: t.x, y: t.y, base: t.base, z: t.z, customdata: t.customdata,
                              mode: t.mode, type: t.type})),
      layout: {title: d.layout.title.text,
      showlegend: d.layout.showlegend, yaxis: d.layout.yaxis && {type: d.layout.yaxis.type},
      updatemenus: (d.layout.updatemenus || []).map(m => ({active: m.active}))},
      legend: Array.from(d.querySelectorAll('.legend .traces text')).map(t => t.textContent)}; });
  return out; })()"""


def _plots(got, section):
    return {k: v for k, v in got["extra"].items() if k.startswith(section + "-")}


@pytest.fixture(scope="module")
def ddp_report(ddp_run, tmp_path_factory, browser):  # noqa: F811
    """The DDP job's report written inside (a copy of) its run directory, as ``distprof report RUN`` does."""
    run = tmp_path_factory.mktemp("ddp-report") / "run"
    shutil.copytree(ddp_run, run)
    out = run / "report.html"
    r = write_report(str(run), str(out))
    got = open_report(browser, out, run.parent / "ddp.png", extra=PLOTS)
    return run, r, got


def test_time_in_a_phase_that_runs_no_op_is_not_idle(ddp_report):
    """Rank 1 sleeps in train/data: no op runs, yet it is busy in user code. It has its own colour, not idle."""
    run, r, got = ddp_report
    s = analyze.summary(str(run))
    host = {x["rank"]: x["temporal"]["host"] for x in s["ranks"]}
    assert host[1]["in_phases_us"] >= 0.9 * 4 * SLOW_S * 1e6  # four profiled steps, each sleeping SLOW_S
    assert host[1]["in_phases_us"] <= host[1]["idle_us"]  # a part of the time no op runs (the JSON keeps idle_us)
    (fig,) = _plots(got, Plot.TEMPORAL).values()
    bars = {t["name"]: dict(zip(t["x"], t["y"])) for t in fig["data"]}
    phase = bars["in annotated phases (no ops traced)"]
    # (Most of its span: 0.5-0.8 measured; a loaded machine stretches its ops, so the bound leaves room.)
    assert phase["train 1"] == pytest.approx(host[1]["in_phases_share"]) and phase["train 1"] > 0.3
    # What is left as idle is the rest of the time no op runs, and the four parts still fill the span.
    assert bars["idle"]["train 1"] == pytest.approx(host[1]["idle_share"] - host[1]["in_phases_share"])
    assert bars["idle"]["train 1"] < phase["train 1"]
    for rank in ("train 0", "train 1"):
        assert sum(b[rank] for b in bars.values()) == pytest.approx(1.0)
    assert "in annotated phases (no ops traced)" in got["text"]


def test_step_time_opens_on_the_view_that_differs_across_ranks(ddp_report):
    """Both ranks' steps last as long (rank 0 waits for rank 1): the heatmap opens on busy (or, when a loaded
    machine slows rank 0's own work so that waited differs more, on waited: rank 0's wait for rank 1), never on
    duration, and says why."""
    _, r, got = ddp_report
    (fig,) = _plots(got, Plot.STEP_TIME).values()
    (menu,) = fig["layout"]["updatemenus"]
    assert menu["active"] in (1, 2)  # duration, busy, waited
    view, hot, cold = ("busy_us", 1, 0) if menu["active"] == 1 else ("waited_us", 0, 1)
    z = fig["data"][0]["z"]
    rows = sorted(analyze.steps(os.path.dirname(r["out"]))["steps"], key=lambda row: row["step"])
    want = [[next(x[view] for x in row["ranks"] if x["rank"] == rank) / 1000 for row in rows] for rank in (0, 1)]
    assert z == [pytest.approx(want[0], abs=1e-3), pytest.approx(want[1], abs=1e-3)]
    assert min(z[hot]) > max(z[cold]) + 0.5 * SLOW_S * 1000  # the culprit stands out the moment the page opens
    assert f"train opens on {view.removesuffix('_us')}: ranks differ by up to" in got["text"]


def test_toolbar_never_covers_the_step_time_buttons(ddp_report, browser):  # noqa: F811
    run, _, _ = ddp_report
    boxes = """Array.from(document.querySelectorAll('[id^="step-time-"]')).map(d => {
        const r = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
        return {bar: r(d.querySelector('.modebar')), title: r(d.querySelector('.gtitle')),
                buttons: Array.from(d.querySelectorAll('.updatemenu-button')).map(r)}; })"""
    for width in (1280, 720):
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.set_default_timeout(180_000)  # a bound, not a measure: 2 busy cores took 6-9 s for 1,024 ranks
        page.goto((run / "report.html").as_uri(), wait_until="load")
        page.wait_for_function("document.querySelectorAll('.modebar').length > 0")
        for plot in page.evaluate(boxes):
            assert len(plot["buttons"]) == 3
            for b in plot["buttons"]:
                for other in (plot["bar"], plot["title"]):
                    apart = b[2] <= other[0] or other[2] <= b[0] or b[3] <= other[1] or other[3] <= b[1]
                    assert apart, (width, b, other)
        page.close()


def test_a_finding_links_its_traces_and_draws_its_worst_step(ddp_report):
    run, r, got = ddp_report
    (f, *_) = [f for f in r["findings"] if f["id"] == "straggler"]
    assert f["evidence"]["ranks"][0] == 1
    i = r["findings"].index(f) + 1
    # Links relative to the report's folder, each to a trace file of the finding's ranks that is there.
    traces = got["extra"]
    html = (run / "report.html").read_text()
    hrefs = [h.split('"', 1)[0] for h in html.split('class="trace" href="')[1:]]
    assert hrefs and all(not h.startswith(("/", "..")) and (run / unquote(h)).is_file() for h in hrefs)
    assert {int(h.split("/rank")[1][:5]) for h in hrefs} == set(f["evidence"]["ranks"])
    # The worst step as a timeline: rank 1 (the culprit) first, asleep in train/data; rank 0 waiting for it.
    tl = traces[f"finding-{i}-timeline"]
    assert r["timelines"][i - 1]["ranks"] == [1, 0] and "Worst step: step" in tl["layout"]["title"]
    lanes = {t["name"]: t for t in tl["data"]}
    data = lanes["train/data"]
    on_1 = [x for x, y in zip(data["x"], data["y"]) if y == 0]
    assert max(on_1) >= 0.9 * SLOW_S * 1000
    wait = lanes["waiting for a later rank"]
    on_0 = [(x, c) for x, y, c in zip(wait["x"], wait["y"], wait["customdata"]) if y == 1]
    assert sum(x for x, _ in on_0) >= 0.8 * SLOW_S * 1000 and {c for _, c in on_0} == {1}
    # The waiting drawn is what steps measures for rank 0 in that step (stragglers' matching), to the resolution.
    step = r["timelines"][i - 1]["step"]
    (row,) = [row for row in analyze.steps(str(run))["steps"] if row["step"] == step]
    waited = next(x["waited_us"] for x in row["ranks"] if x["rank"] == 0) / 1000
    assert sum(x for x, _ in on_0) == pytest.approx(waited, rel=0.01)
    assert "collective" in lanes and "compute" in lanes
    assert "its step (grey)" in got["text"] and "rank 1 cost the others the most waiting" in got["text"]


def test_trace_paths_are_shown_not_linked_when_the_report_is_elsewhere(ddp_report, tmp_path):
    run, _, _ = ddp_report
    inv = analyze.investigate(str(run), parts=("timeline",))
    f = Finding(id="straggler", claim="c", cost_us=1.0, fix="f",
                evidence=FindingEvidence(role="train", ranks=[1], steps=[2]))
    (tmp_path / "elsewhere").mkdir()
    out = tmp_path / "elsewhere" / "r.html"
    build_report(inv, [f], str(out))
    html = out.read_text()
    assert 'class="trace"' not in html
    assert f"<code>{run}/train/rank00001/" in html  # the path, as text


# ---- synthetic runs -------------------------------------------------------------------------------------
def _run(root, ranks):
    """A run directory: ``ranks`` maps (role, rank) to its events inside ProfilerStep#1 (0 to 1,000 µs)."""
    for (role, rank), events in ranks.items():
        d = root / role / f"rank{rank:05d}"
        d.mkdir(parents=True)
        (d / "manifest.jsonl").write_text("")
        write(d / "step00000001-00000001.pt.trace.json", [X("ProfilerStep#1", 0, 1000, cat="user_annotation"), *events],
              distributedInfo={"rank": rank, "world_size": 2})
    return root


def _two_roles(root):
    """actor: 2 ranks computing, then all-reducing (nothing overlaps); ref: 1 rank, one phase. Both run aten::mm."""
    ann = "user_annotation"
    return _run(root, {
        ("actor", 0): [X("actor/update", 5, 990, cat=ann), X("aten::mm", 10, 300), X("c10d::allreduce_", 600, 300)],
        ("actor", 1): [X("actor/update", 5, 990, cat=ann), X("aten::mm", 10, 400), X("c10d::allreduce_", 600, 300)],
        ("ref", 0): [X("ref/log_probs", 5, 500, cat=ann), X("aten::mm", 10, 50), X("aten::add", 100, 20)],
    })


@pytest.fixture(scope="module")
def two_roles(tmp_path_factory, browser):  # noqa: F811
    root = tmp_path_factory.mktemp("two-roles")
    run = _two_roles(root / "run")
    r = write_report(str(run), str(root / "r.html"))
    return root, r, open_report(browser, root / "r.html", root / "r.png", extra=PLOTS)


def test_roles_are_never_added_together(two_roles):
    _, r, got = two_roles
    # Top CPU ops: one figure per role, each summing its own ranks only (0.3 + 0.4 ms, not 0.75 ms).
    ops = {v["layout"]["title"]: dict(zip(v["data"][0]["y"], v["data"][0]["x"]))
           for v in _plots(got, Plot.OPS).values()}
    assert ops == {"Top CPU ops, actor (self time, 2 ranks)": {"1. aten::mm": 0.7, "2. c10d::allreduce_": 0.6},
                   "Top CPU ops, ref (self time, 1 rank)": {"1. aten::mm": 0.05, "2. aten::add": 0.02}}


def test_a_role_of_one_phase_has_a_legend(two_roles):
    _, r, got = two_roles
    # A role of one phase names it in a legend, as plotly.js drew it (plotly hides the legend of one trace).
    phases = {v["layout"]["title"]: v for v in _plots(got, Plot.PHASES).values()}
    ref = phases["Phases (self time), ref"]
    assert ref["layout"]["showlegend"] is True and ref["legend"] == ["ref/log_probs"]
    assert phases["Phases (self time), actor"]["legend"] == ["actor/update"]


def test_overlap_says_why_nothing_overlaps(two_roles, tmp_path):
    _, r, got = two_roles
    note = {p["id"]: p for p in r["plots"]}[Plot.OVERLAP]["note"]
    assert note.startswith("Nothing overlaps: 600 µs of communication on 2 ranks") and "take turns" in note
    assert note in got["text"]
    (fig,) = _plots(got, Plot.OVERLAP).values()  # not a blank plot: each rank's communication, not overlapped
    assert {t["name"]: t["y"] for t in fig["data"]} == {"overlapped": [0, 0], "not overlapped": [1, 1]}
    # Collectives and no compute at all: said so.
    bare = _run(tmp_path / "bare", {("actor", r_): [X("c10d::allreduce_", 100, 500)] for r_ in (0, 1)})
    r = write_report(str(bare), str(tmp_path / "bare.html"))
    assert "these ranks trace no compute at all" in {p["id"]: p for p in r["plots"]}[Plot.OVERLAP]["note"]


def test_launch_delay_p50_and_p95_both_readable(browser, tmp_path):  # noqa: F811
    """DLRM: p50 is 2 µs on every rank, p95 up to 373 µs. On a log axis with markers both are drawn, p50 well
    above the axis floor and apart from p95."""
    out = tmp_path / "dlrm.html"
    write_report(DLRM, str(out))
    marks = """Array.from(document.querySelectorAll('#idle-1 .scatterlayer .trace')).map(t =>
        Array.from(t.querySelectorAll('.points path')).map(p => { const b = p.getBoundingClientRect();
            return [b.top + b.height / 2, b.height]; }))"""
    got = open_report(browser, out, tmp_path / "dlrm.png", extra=f"[{PLOTS}, {marks}]")
    plots, drawn = got["extra"]
    fig = plots["idle-1"]
    assert fig["layout"]["yaxis"]["type"] == "log"
    by = {t["name"]: t for t in fig["data"]}
    s = analyze.summary(DLRM)
    assert by["delay p50"]["y"] == [r["launch"]["delay_us"]["p50"] for r in s["ranks"]] == [2.0] * 8
    assert by["delay p95"]["y"] == pytest.approx([r["launch"]["delay_us"]["p95"] for r in s["ranks"]])
    assert by["delay p50"]["mode"] == by["delay p95"]["mode"] == "markers"
    p50, p95 = [d for d in drawn if len(d) == 8][:2]
    assert all(h >= 6 for _, h in p50 + p95)  # markers of a visible size
    # Rank 0: p95 / p50 = 185; a linear axis would put p50 under one pixel from the floor. Here they are apart.
    assert p50[0][0] - p95[0][0] > 100


def test_a_card_prints_one_percentage(tmp_path):
    inv = analyze.investigate(DLRM)
    carried = Finding(id="straggler", claim="rank 7 costs the others 35.6 ms of waiting per step (63% of step time)",
                      cost_us=35552.0, cost_share=0.65, fix="f", evidence=FindingEvidence(ranks=[7], steps=[10]))
    plain = Finding(id="host_sync", claim="cudaStreamSynchronize blocks the host", cost_us=1000.0, cost_share=0.2,
                    fix="f")
    five = Finding(id="x", claim="idle 15% of its span", cost_us=1000.0, cost_share=0.05, fix="f")
    html = render_report(inv, [carried, plain])
    card = html.split('id="finding-1"', 1)[1].split("</li>", 1)[0]
    assert "63%" in card and "65%" not in card and card.count("%") == 1
    card = html.split('id="finding-2"', 1)[1].split("</li>", 1)[0]
    assert card.count("20% of step time") == 1
    from distprof.report.page import cost_text

    assert cost_text(carried) == "35.6 ms" and cost_text(plain) == "1.0 ms (20% of step time)"
    assert cost_text(five) == "1.0 ms (5% of step time)"  # "15%" is not "5%"


# ---- throughput: FLOPs/MFU and the collective report (report/perf.py) ------------------------------------------
NUMBERS = """(() => { const out = {};
  document.querySelectorAll('section.table-section').forEach(s => { out[s.id] = {
      rows: Array.from(s.querySelectorAll('tbody tr')).map(tr => Array.from(tr.cells).map(c => c.innerText)),
      head: Array.from(s.querySelectorAll('table')).map(t => Array.from(t.tHead.rows[0].cells).map(c => c.innerText)),
      na: Array.from(s.querySelectorAll('.na')).map(p => p.innerText),
      plots: Array.from(s.querySelectorAll('.plot')).map(d => d.data.map(t => ({name: t.name, x: t.x, y: t.y}))),
      width: s.scrollWidth <= document.querySelector('main').clientWidth + 1}; });
  return out; })()"""


def test_gpt2_report_shows_mfu_per_step_and_the_roofline_against_the_h100s_peaks(browser, tmp_path):  # noqa: F811
    from tracekit import TRACES

    gpt2 = os.path.join(TRACES, "distprof-h100", "gpt2-bf16-shapes-step4")
    out = tmp_path / "gpt2.html"
    write_report(gpt2, str(out))
    got = open_report(browser, out, tmp_path / "gpt2.png", extra=NUMBERS)["extra"]
    s = analyze.summary(gpt2, workers=1)
    (row,) = s["flops"]
    flops = got["flops"]
    assert flops["rows"][0][:7] == ["trainer", "0", "4", "23.80 ms", "2.86 T", f"{row['tflops_per_s']:,.1f}",
                                    f"{row['mfu']:.1%}"]
    assert flops["rows"][0][7] == "989.4 bf16 (table)" and flops["rows"][0][8] == "H100 SXM"
    # the top ops, each at its input shapes (two aten::mul rows, told apart), then the roofline plotly.js drew
    ops = flops["rows"][1:]
    assert [r[0] for r in ops] == [p["name"] for p in s["flops_ops"]]
    muls = [r[1] for r in ops if r[0] == "aten::mul"]
    assert len(muls) >= 2 and len(set(muls)) == len(muls)
    (plot,) = flops["plots"]
    roof, points = plot[0], plot[-1]
    assert roof["name"].startswith("roof: H100 SXM bf16") and max(roof["y"]) == pytest.approx(989.4)
    with_flops = [p for p in s["flops_ops"] if p["flops"] and p["intensity"] and p["tflops_per_s"]]
    assert points["x"] == pytest.approx([p["intensity"] for p in with_flops])
    assert points["y"] == pytest.approx([p["tflops_per_s"] for p in with_flops])
    # one GPU, no collectives: the section says so
    assert got["collectives"]["na"] == ["No collectives in these traces."] and flops["width"]


def test_dlrm_report_has_the_collective_table_per_group(browser, tmp_path):  # noqa: F811
    out = tmp_path / "dlrm.html"
    build_report(analyze.investigate(DLRM, workers=1), [], str(out))
    page = open_report(browser, out, tmp_path / "dlrm-numbers.png", extra=NUMBERS)
    got = page["extra"]
    coll = {(r[1], r[2]): r for r in got["collectives"]["rows"]}
    s = analyze.summary_result(DLRM, workers=1)
    want = {(c.group, c.name): c for c in s.collectives}
    assert set(coll) == set(want) == {("default", "allreduce"), ("default", "sendrecv")}
    send = coll[("default", "sendrecv")]
    assert send[4] == "5" and send[12] == "7 (80%)"  # rank 7 starts last in 4 of the 5 SendRecvs
    # 2023's traces: sizes from the nccl:* ranges, no group size (no busbw); the all-to-all-v's imbalance
    assert send[5] == "64.45 kB" and send[11] == "-" and "group size not recorded" in send[14]
    assert send[13] == f"{want[('default', 'sendrecv')].imbalance:,.2f}" == "3.92"
    assert got["collectives"]["head"][0][:6] == ["role", "group", "collective", "group size", "count", "bytes"]
    from distprof.report.termcoll import last_arrivals

    (line,) = last_arrivals(s.collectives)
    assert line in page["text"]
