"""The training side: what runs inside every training process.

- :mod:`.profiler`: ``Profiler``, the window state machine (from config alone: which steps, ranks and roles),
  with its collaborators :mod:`.steptime`, :mod:`.guard`, :mod:`.ondemand` and :mod:`.stages`, which see it
  through :mod:`.owner`;
- :mod:`.faults`: the one fault guard (log once, switch off, or re-raise), the integrations' too;
- :mod:`.annotate`: ``annotate(name)`` ranges, free when nothing listens;
- :mod:`.trigger`: on-demand capture requests and their acknowledgements; :mod:`.ondemand`: one profiler's answers;
- :mod:`.stages`: discrete mode (one window per annotated stage of a planned step);
- :mod:`.steptime`: profiling's own cost (baseline and profiled step times);
- :mod:`.guard`: the memory guard (host memory, trace size);
- :mod:`.shutdown`: crash-safe capture (atexit, SIGTERM, SIGINT, fork);
- :mod:`.compat`: torch.profiler against code that swaps parameters (FSDP2);
- :mod:`.backends`: torch.profiler, CUDA memory, CUDA ranges for nsys, process tools;
- :mod:`.wrap`: the process-tool wrapper Ray runs as a worker's ``py_executable``;
- :mod:`.engines`: rollout engines' own profilers (vLLM, SGLang), driven at the planned steps.
"""
