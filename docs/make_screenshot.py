"""Write docs/report.png, the README's picture of ``distprof report``: the report of a real trace set
opened in headless Chromium (Debian's ``chromium``, driven by Playwright), its diagnosis and first plots.

    python docs/make_screenshot.py [TRACES] [--out docs/report.png] [--chromium /usr/bin/chromium]

TRACES defaults to the 8-rank DLRM set in tests/data (real V100 traces, rank 7 the straggler).
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import tempfile

from distprof.report import write_report

HERE = pathlib.Path(__file__).resolve().parent
DLRM = HERE.parent / "tests" / "data" / "dlrm-8rank-v100"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
        "--disable-component-update", "--disable-sync"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="?", default=str(DLRM))
    ap.add_argument("--out", default=str(HERE / "report.png"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument("--height", type=int, default=1350, help="Pixels of the page's top to keep.")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        html = os.path.join(tmp, "report.html")
        r = write_report(a.traces, html)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=a.chromium, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": a.width, "height": a.height})
            page.goto(pathlib.Path(html).as_uri(), wait_until="load")
            page.wait_for_function("Array.from(document.querySelectorAll('.plot')).every(d => d.querySelector('.main-svg'))")
            page.screenshot(path=a.out)
            browser.close()
    logging.info("%s: report of %s (%d findings, %d bytes of HTML)", a.out, a.traces, len(r["findings"]), r["bytes"])


if __name__ == "__main__":
    main()
