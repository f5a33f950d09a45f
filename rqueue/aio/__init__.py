"""rqueue on redis-py's asyncio client: the API of :mod:`rqueue`, awaitable
(docs/aio.md). ``await rqueue.aio.connect(url)`` takes the same URLs and
raises the same exceptions; queues, consumers and deliveries are settled
with ``await``; :class:`Worker` runs handlers as tasks on the caller's
event loop."""

from .client import Client, connect
from .consumer import Consumer, Delivery
from .partitions import PartitionedConsumer, PartitionedQueue
from .queue import Queue
from .worker import Worker

__all__ = ["Client", "Consumer", "Delivery", "PartitionedConsumer", "PartitionedQueue", "Queue", "Worker", "connect"]
