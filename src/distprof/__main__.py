"""``python -m distprof VERB ...``: the ``distprof`` command, where its script is not on PATH."""

from distprof.cli import main

main()
