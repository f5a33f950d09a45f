"""A handler module that takes 2 s to import, as one with heavy imports
may: tests/test_time_limits.py runs it in child processes
(rqueue.worker.InProcess), whose start must not count against a limit."""

import time

import rqueue

time.sleep(2.0)


def work(d: rqueue.Delivery) -> object:
    if d.data == b"hang":
        time.sleep(60)  # only killing the process ends it
    return {"seq": d.seq}
