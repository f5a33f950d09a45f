"""pytest plugin: rqueue's test suite with every sync script call sent as
FCALL (see fcall.py). Run from the clone's root:

  PYTHONPATH=benchmarks/prototypes/functions .venv/bin/pytest -p pytest_fcall \
      tests/test_fetch.py -k "redis or memory"
"""

from __future__ import annotations

import fcall


def pytest_configure(config: object) -> None:
    fcall.install()
