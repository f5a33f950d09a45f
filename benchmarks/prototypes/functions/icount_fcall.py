"""benchmarks/icount.py with every rqueue script call sent as FCALL.

usage: .venv/bin/python benchmarks/prototypes/functions/icount_fcall.py SCENARIO [N]

The library is loaded by the first call (FUNCTION LOAD), inside the
warm-up, so the counted calls load nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import fcall  # noqa: E402
import icount  # noqa: E402

if __name__ == "__main__":
    fcall.install()
    sys.exit(icount.main())
