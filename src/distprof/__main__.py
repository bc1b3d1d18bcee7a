"""``python -m distprof VERB ...``: the ``distprof`` command, where its script is not on PATH."""

from .cli import main

main()
