"""The ``diagnose`` rules, by family: :mod:`.common` (the findings' shape, thresholds, the path model, the job
as the rules see it), :mod:`.straggler`, :mod:`.roles`, :mod:`.device`, :mod:`.copies`, :mod:`.host`.
:mod:`distprof.analysis.diagnose` runs them in order and documents each rule."""
