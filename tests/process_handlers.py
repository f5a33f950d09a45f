"""Handlers that tests/test_time_limits.py runs in child processes
(rqueue.worker.InProcess)."""

import os
import time

import rqueue


def work(d) -> object:
    if d.data == b"hang":
        with open(d.headers["pid-file"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)  # a blocking C call: only killing the process ends it
    if d.data == b"fail":
        raise ValueError("boom")
    if d.data == b"reject":
        raise rqueue.Reject("nope")
    if d.data == b"print":
        print("noise on stdout")  # must not reach the reply pipe
        return b"printed"
    return {"seq": d.seq, "count": d.delivery_count}
