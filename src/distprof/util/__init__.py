"""The ground floor: small helpers every layer may use, importing nothing else of distprof.

- :mod:`.intervals`: interval union with numpy (busy time with overlap counted once);
- :mod:`.safetext`: untrusted text (trace and file names) made visible (control characters as escapes);
- :mod:`.procfs`: what /proc says about processes we do not own;
- :mod:`.runtime`: rank, world size, host and versions, without importing torch;
- :mod:`.envvars`: distprof's own ``DISTPROF_*`` variables that are not settings;
- :mod:`.logs`: distprof's log lines in processes that build a Profiler;
- :mod:`.raynodes`: Ray's nodes (alive, named, pinned to; node loss told apart), Ray imported only when called.
- :mod:`.problem`: ``Problem``, the one record of what went wrong (a config field, a file, a node), and the
  helpers that keep its values short.
"""
