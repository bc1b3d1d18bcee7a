"""The reading side's first floor: a trace's bytes to distprof's columns, trusting nothing.

- :mod:`.source`: a trace's bytes (local or fsspec; gzip inflated in bounded pieces; salvage);
- :mod:`.listing`: the trace files under a path, with what the run directory's manifest says of each;
- :mod:`.reader`: ``TraceStream``, batches of msgspec events with a report of what was lost;
- :mod:`.salvage`: what malformed JSON cost;
- :mod:`.table`: ``TraceTable``, the one pass per file into numpy columns and merged interval sets;
- :mod:`.splitpool`: the worker processes that decode the runs of one big file;
- :mod:`.vocab`: the one event vocabulary (Kineto categories, collectives, syncs, threads);
- :mod:`.selection`: ``Selection`` (ranks, roles, steps);
- :mod:`.ranks`: which files speak for which (role, rank), jobs kept apart.
"""
