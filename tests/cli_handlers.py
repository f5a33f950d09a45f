"""Handlers that tests/test_worker_cli.py runs through `rqueue worker`."""

import rqueue


def handle(delivery: rqueue.Delivery) -> None:
    if delivery.data == b"poison":
        raise rqueue.Reject("poison")


NOT_CALLABLE = 42
