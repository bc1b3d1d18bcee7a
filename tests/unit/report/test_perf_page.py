"""The report's throughput sections (report/perf.py) as HTML, without a browser: what each table holds on the real
traces, what a section says when it does not apply, and that trace text arrives escaped. (Chromium draws them in
tests/e2e/test_report_views.py.)"""

import os

import msgspec
from tracekit import DLRM, TRACES

from distprof.analysis import analyze
from distprof.analysis.records_comm import CollectiveRow
from distprof.analysis.records_flops import FlopsRow
from distprof.report import perf, render_report

H100 = os.path.join(TRACES, "distprof-h100")
GPT2 = os.path.join(H100, "gpt2-bf16-shapes-step4")
NCCL = os.path.join(TRACES, "hta", "nccl_data.json.gz")


def test_gpt2_flops_section_has_the_step_row_and_the_top_ops_at_their_shapes():
    s = analyze.summary_result(GPT2, workers=1)
    b = perf.flops_block(s)
    (row,) = s.flops
    assert b.note is None and f"<td>{row.tflops_per_s:,.1f}</td><td>{row.mfu:.1%}</td>" in b.html
    assert "<td>2.86 T</td>" in b.html and "989.4 bf16 (table)" in b.html and "H100 SXM" in b.html
    assert b.html.count('<td class="t">aten::mul</td>') >= 2 and "[8,1024,3072]x[8,1024,3072]" in b.html
    (fig,) = b.figures.values()
    roof, points = fig.data[0], fig.data[-1]
    assert roof.name.startswith("roof: H100 SXM bf16") and max(roof.y) == 989.4
    assert all(p.flops for p in s.flops_ops if p.intensity in points.x)


def test_sections_that_do_not_apply_say_why():
    s = analyze.summary_result(os.path.join(H100, "transformer-fp32"), workers=1)
    assert "record_shapes is needed" in perf.flops_block(s).note and not perf.flops_block(s).html
    assert perf.collectives_block(None).note == "No collectives in these traces."
    cpu = analyze.summary_result(os.path.join(TRACES, "hta", "cpu_only_rank-34.pt.trace.json.gz"), workers=1)
    assert perf.flops_block(cpu).note is not None


def test_collective_table_on_htas_nccl_trace():
    s = analyze.summary_result(NCCL, workers=1)
    html = perf.collectives_block(s.collectives).html
    ar = next(c for c in s.collectives if c.name == "allreduce")
    assert "<td>306.68 MB</td>" in html and f"<td>{ar.busbw_gbps:,.2f} GB/s</td>" in html
    assert '<td class="t">0 (default_pg)</td>' in html and "one rank traced" in html


def test_rows_beyond_the_cap_keep_the_lowest_mfu_and_say_how_many_more():
    rows = [FlopsRow(role="r", rank=i, step=1, flops=1e12, tflops_per_s=1.0, mfu=i / 1000, peak_tflops=1000.0,
                     dtype="bf16", wall_us=1e6) for i in range(perf.MAX_ROWS + 5)]
    html = perf._flops_rows(rows)
    assert html.count("<tr>") == perf.MAX_ROWS + 1 and "5 more rows" in html
    assert f"<td>{perf.MAX_ROWS + 4}</td>" not in html  # the highest MFU left out


def test_trace_text_arrives_escaped():
    evil = "<img src=x onerror=alert(1)>"
    row = CollectiveRow(role=evil, group=evil, name=evil, count=1, bytes=None, min_dur_us=None, skew_us=None,
                        algbw_gbps=None, busbw_gbps=None, last_rank=None, last_share=None, group_desc=evil, note=evil)
    html = perf.collectives_block([row]).html
    fl = FlopsRow(role=evil, rank=0, step=1, flops=1.0, tflops_per_s=1.0, mfu=0.1, peak_tflops=1.0, dtype=evil,
                  device=evil, peak_source="table")
    html += perf._flops_rows([fl])
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_the_page_places_the_sections_after_the_plots_and_links_them():
    inv = analyze.investigate(DLRM, workers=1)
    page = render_report(inv, [])
    flops, coll = page.index('<section id="flops"'), page.index('<section id="collectives"')
    assert page.index('class="plot-section"') < flops < coll
    assert '<a href="#flops">Achieved TFLOP/s and MFU</a>' in page
    assert '<a href="#collectives">Collectives per process group</a>' in page
    assert msgspec.json.encode(inv.summary.collectives)  # (the figures are summary's)
