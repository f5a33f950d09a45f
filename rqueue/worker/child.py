"""The child process of an InProcess handler (rqueue/worker/processes.py):
``python -m rqueue.worker.child module.path:function`` serves requests on
stdin and writes replies on stdout until stdin ends. The handler's own
prints go to stderr: stdout carries the replies alone."""

from __future__ import annotations

import os
import sys

from .processes import serve

if __name__ == "__main__":
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.argv[1], sys.stdin.buffer, replies)
