"""What keeps the driver small when many ranks are read: each rank's compact result, names shared among ranks."""

from tracekit import DLRM

from distprof.analysis import analyze
from distprof.analysis.parallel import share_strings


def test_ranks_read_in_workers_share_one_copy_of_each_name():
    run = analyze.read(DLRM, analyze.SUMMARY_PARTS, workers=2)
    kernels = [r.parts["summary"]["kernels"] for r in run.files]
    assert len(kernels) == 8
    common = set(kernels[0]) & set(kernels[5])
    assert len(common) > 20
    first = {k: k for k in kernels[0]}
    assert all(k is first[k] for k in kernels[5] if k in common)  # the same object, not an equal copy
    # ... and the figures are those of a read in one process.
    alone = analyze.read(DLRM, analyze.SUMMARY_PARTS, workers=1)
    assert [r.parts["summary"] for r in alone.files] == [r.parts["summary"] for r in run.files]


def test_share_strings_keeps_every_value():
    seen = {}
    a = share_strings({"k" * 3: ("x" * 2, [1, "y"]), 4: None}, seen)
    b = share_strings({"".join(["k"] * 3): ("".join(["x", "x"]), [1, "y"]), 4: None}, seen)
    assert a == b and [k for k in b if k == "kkk"][0] is [k for k in a if k == "kkk"][0]
    assert b["kkk"][0] is a["kkk"][0]


def test_share_strings_reaches_into_dataclasses_and_leaves_numbers_and_classes_alone():
    from dataclasses import dataclass, field

    @dataclass
    class Rec:
        name: str
        per: dict = field(default_factory=dict)
        rows: list = field(default_factory=list)

    seen: dict = {}
    a = share_strings([Rec("".join(["op", "1"]), {"".join(["k", "1"]): 2.5}, [1, (3, "x")])], seen)
    b = share_strings([Rec("".join(["op", "1"]), {"".join(["k", "1"]): 2.5}, [1, (3, "".join("x"))]), Rec, 7, None],
                      seen)
    assert a[0] == b[0] and b[1] is Rec and b[2:] == [7, None]
    assert b[0].name is a[0].name and next(iter(b[0].per)) is next(iter(a[0].per))
