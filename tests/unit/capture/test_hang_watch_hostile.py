"""Hang evidence's writer against a run directory prepared by someone else (red-team pass): a FIFO where
``hang-stacks.txt`` goes must not block the training process (opening it to write waited for a reader) nor
receive the C watchdog's dumps; the evidence itself is still written."""

import os

from distprof.capture.hang import HangWatch, _open_stacks
from distprof.config.hang import HangOptions
from distprof.rundir.layout import HANG, HANG_STACKS


def test_a_fifo_where_the_stacks_go_is_skipped_not_waited_on(tmp_path):
    folder = tmp_path / "train" / "rank00000"
    folder.mkdir(parents=True)
    fifo = folder / HANG_STACKS
    os.mkfifo(fifo)
    assert _open_stacks(str(fifo)) is None  # nobody reads it: ENXIO, not a wait
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # someone reads it: it opens, and is refused as no file
    try:
        assert _open_stacks(str(fifo)) is None
        watch = HangWatch(str(tmp_path), "train", 0, 1, HangOptions(enabled=True, timeout_s=60), lambda: 0)
        watch.start()
        try:
            assert watch._stacks is None and watch._thread is not None
        finally:
            watch.stop()
    finally:
        os.close(reader)
    assert (folder / HANG).is_file()


def test_a_regular_stacks_file_is_opened_blocking(tmp_path):
    f = _open_stacks(str(tmp_path / HANG_STACKS))
    try:
        assert f is not None and os.get_blocking(f.fileno())
    finally:
        f.close()
