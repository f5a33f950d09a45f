"""``python -m rqueue.cli``: the same as the ``rqueue`` console script."""

from rqueue.cli import main

main()
