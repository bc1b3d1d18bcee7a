"""The reading side's first floor: a trace's bytes to distprof's columns, trusting nothing.

- :mod:`.source`: a trace's bytes (local or fsspec; gzip inflated in bounded pieces; salvage);
- :mod:`.listing`: the trace files under a path, with what the run directory's manifest says of each;
- :mod:`.reader`: ``TraceStream``, batches of msgspec events with a report of what was lost;
- :mod:`.events`: the msgspec event structs (whole and lean) and their decoders;
- :mod:`.jsonscan`: where an untrusted JSON value ends, the top object's members, why an element is no event;
- :mod:`.cutter`: a batch's bytes into events, salvaging what it can;
- :mod:`.runs`: runs of whole events handed to another process (``decode_run``);
- :mod:`.salvage`: what reading lost (``ReadReport``) and what malformed JSON cost;
- :mod:`.table`: ``TraceTable``, the one pass per file into numpy columns, and ``Sets``, its merged interval sets;
- :mod:`.columns`: ``Columns``, what the pass keeps batch by batch (and a worker's run, ``reduce_run``);
- :mod:`.splitpool`: the worker processes that decode the runs of one big file;
- :mod:`.vocab`: the one event vocabulary (Kineto categories, collectives, syncs, threads);
- :mod:`.selection`: ``Selection`` (ranks, roles, steps);
- :mod:`.ranks`: which files speak for which (role, rank), jobs kept apart.
"""
