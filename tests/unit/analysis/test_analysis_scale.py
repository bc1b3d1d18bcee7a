"""What keeps the driver small when many ranks are read: each rank's compact result, names shared among ranks."""

from tracekit import DLRM, X, write

from distprof.analysis import analyze
from distprof.analysis.parallel import share_strings


def test_ranks_read_in_workers_give_the_figures_of_one_process():
    run = analyze.read(DLRM, analyze.SUMMARY_PARTS, workers=2)
    assert len(run.files) == 8
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


def test_files_go_to_the_workers_a_few_per_task_in_order():
    """map_files hands several files to a worker per task where there are many (the driver's work per task is
    serial): every index once, in order, tasks of at most _CHUNK_MAX, at least _CHUNKS_PER_WORKER per worker."""
    from distprof.analysis.parallel import _CHUNK_MAX, _CHUNKS_PER_WORKER, _tasks

    for n, workers in ((1, 2), (10, 2), (64, 2), (256, 2), (1024, 16), (1024, 2), (5000, 3)):
        tasks = _tasks(n, workers)
        assert [k for t in tasks for k in t] == list(range(n))
        assert max(map(len, tasks)) <= _CHUNK_MAX
        assert len(tasks) >= min(n, workers * _CHUNKS_PER_WORKER)
    assert max(map(len, _tasks(1024, 2))) == _CHUNK_MAX  # (many files: tasks of several)


def test_an_unreadable_file_inside_a_task_is_its_own_error(tmp_path):
    """Tasks of several files: a file that cannot be read is one error in its place; the others of its task and
    every other task are read, in file order, as in one process."""
    from distprof.analysis.parallel import _tasks
    from distprof.trace.listing import find_traces

    n = 2 * 16 * 3  # tasks of 3 files on 2 workers
    assert max(map(len, _tasks(n, 2))) == 3
    for r in range(n):
        write(tmp_path / f"rank-{r:03d}.json.gz", [X("ProfilerStep#1", 0, 100, cat="user_annotation"),
                                                  X(f"k{r % 5}", 10, 5 + r, cat="kernel", pid=0, tid=7),
                                                  X("common_kernel", 20, 3, cat="kernel", pid=0, tid=7)],
              distributedInfo={"rank": r, "world_size": n})
    (tmp_path / "rank-040.json.gz").write_bytes(b"\x1f\x8b not gzip")  # the middle of a task
    run = analyze.read(str(tmp_path), ("summary",), workers=2)
    assert [e.path for e in run.errors] == [str(tmp_path / "rank-040.json.gz")]
    paths = [r.info.path for r in run.files]
    assert paths == [f.path for f in find_traces(str(tmp_path)) if not f.path.endswith("rank-040.json.gz")]
    alone = analyze.read(str(tmp_path), ("summary",), workers=1)
    assert [r.parts["summary"] for r in alone.files] == [r.parts["summary"] for r in run.files]
    assert [r.info.rank for r in run.files] == [r for r in range(n) if r != 40]
    # The worker shares its results' strings: the files of one task name a kernel with one object (pickled once);
    # the driver walks nothing itself.
    by_rank = {r.info.rank: r for r in run.files}
    for task in _tasks(n, 2):
        names = [next(k for k in by_rank[r].parts["summary"]["kernels"] if k == "common_kernel")
                 for r in task if r in by_rank]
        assert len(names) >= 2 and all(x is names[0] for x in names)
