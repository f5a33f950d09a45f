"""Handlers that tests/test_worker_cli.py runs through `rqueue worker`."""

import rqueue


def handle(delivery: rqueue.Delivery) -> None:
    if delivery.data == b"poison":
        raise rqueue.Reject("poison")


def handle_all(deliveries: list[rqueue.Delivery]) -> list[object]:
    """handle, as a batch handler (`--batch N`)."""
    return [rqueue.Reject("poison") if d.data == b"poison" else True for d in deliveries]


@rqueue.batch_handler(size=2)
def handle_pairs(deliveries: list[rqueue.Delivery]) -> list[object]:
    return handle_all(deliveries)


NOT_CALLABLE = 42
