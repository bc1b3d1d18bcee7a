"""What distprof's own collective record (capture/collrec.py, ``hang: {enabled: true}``) adds to one collective
call: a stand-in collective that does nothing, called bare and through the record's wrapper.

    PYTHONPATH=src python benchmarks/bench_hang_record.py
"""

from __future__ import annotations

import timeit

from distprof.capture import collrec


def all_reduce(tensor, op=None, group=None, async_op=False):
    return None


def main() -> None:
    wrapped = collrec._wrap("all_reduce", all_reduce)
    n = 200_000
    bare = min(timeit.repeat(lambda: all_reduce(1), number=n, repeat=5)) / n
    rec = min(timeit.repeat(lambda: wrapped(1), number=n, repeat=5)) / n
    print(f"bare call {bare * 1e9:.0f} ns, recorded {rec * 1e9:.0f} ns: the record adds {(rec - bare) * 1e9:.0f} ns "
          "per collective")


if __name__ == "__main__":
    main()
