"""The report's size is bounded by ranks, steps and distinct names, never by name length x ranks (issue 19, item
15: 1 MiB phase names on 64 ranks made a 141 MB page because every rank's hover repeated the whole name)."""

import re

from tracekit import X, write

from distprof.report import write_report
from distprof.report.base import NAME_CHARS

RANKS = 16
NAMES = ("a", "b", "c")  # each phase name is one of these letters, repeated


def _run(root, length):
    """A run of RANKS ranks, one step each, three phases whose names are ``length`` characters long (rank 0 slow in
    the first one), and an op in each."""
    for rank in range(RANKS):
        d = root / "actor" / f"rank{rank:05d}"
        d.mkdir(parents=True)
        (d / "manifest.jsonl").write_text("")
        events = [X("ProfilerStep#1", 0, 1000, cat="user_annotation")]
        for i, c in enumerate(NAMES):
            dur = 280 if (rank, i) == (0, 0) else 200
            events += [X(c * length, 10 + i * 300, dur, cat="user_annotation"), X("aten::mm", 20 + i * 300, 100)]
        write(d / "step00000001-00000001.pt.trace.json", events, distributedInfo={"rank": rank, "world_size": RANKS})
    return root


def test_long_phase_names_on_many_ranks_keep_the_page_small(tmp_path):
    small = write_report(str(_run(tmp_path / "short", 8)), str(tmp_path / "short.html"))
    out = tmp_path / "long.html"
    big = write_report(str(_run(tmp_path / "long", 64 << 10)), str(out))
    # Every distinct name may appear in full (cut) a few times, once per figure: never once per rank. Today's page
    # would carry each 64 KiB name 16 times (3 MB more than the short-named page).
    bound = small["bytes"] + len(NAMES) * 8 * NAME_CHARS
    assert big["bytes"] == out.stat().st_size < bound, (big["bytes"], bound)
    html = out.read_text()
    for c in NAMES:
        runs = [len(m.group(0)) for m in re.finditer(f"{c}{{100,}}", html)]
        # The hover's name is cut in the middle (head…tail, with the ellipsis escaped in the figures' JSON) to at
        # most NAME_CHARS characters, and stored once per figure.
        assert runs and max(runs) < NAME_CHARS, (c, runs)
        assert f"{c * 300}\\u2026{c * 300}" in html
        assert len(runs) <= 8, (c, len(runs))
