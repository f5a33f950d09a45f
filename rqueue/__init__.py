"""rqueue: a Redis-backed distributed work queue.

Every state change is one Lua script that runs atomically inside Redis; this
package is the thin client around them. See README.md and SPEC.md.
"""

from .client import Client, connect
from .clock import Clock, ManualClock
from .consumer import Consumer, Delivery
from .errors import (
    AlreadyAcked,
    ConnectionFailed,
    CorruptRecord,
    DeliveryError,
    InvalidInput,
    InvalidName,
    InvalidSetting,
    InvalidURL,
    NotDurable,
    NotHeld,
    NotMember,
    NotPermitted,
    PartialPublish,
    PayloadTooLarge,
    Reject,
    RQueueError,
    ServerTooOld,
    StaleDelivery,
    UnknownDeliveryTag,
    Unroutable,
)
from .partitions import PartitionedConsumer, PartitionedQueue
from .queue import Message, Queue
from .randomness import Randomness
from .results import ConsumerStats, GroupStats, PublishResult, QueueStats
from .settings import Settings
from .worker import PartitionedWorker, Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "AlreadyAcked",
    "Client",
    "Clock",
    "ConnectionFailed",
    "Consumer",
    "ConsumerStats",
    "CorruptRecord",
    "Delivery",
    "DeliveryError",
    "GroupStats",
    "InvalidInput",
    "InvalidName",
    "InvalidSetting",
    "InvalidURL",
    "ManualClock",
    "Message",
    "NotDurable",
    "NotHeld",
    "NotMember",
    "NotPermitted",
    "PartitionedConsumer",
    "PartitionedQueue",
    "PartitionedWorker",
    "PartialPublish",
    "PayloadTooLarge",
    "PublishResult",
    "Queue",
    "QueueStats",
    "RQueueError",
    "Randomness",
    "Reject",
    "ServerTooOld",
    "Settings",
    "StaleDelivery",
    "UnknownDeliveryTag",
    "Unroutable",
    "Worker",
    "WorkerStats",
    "connect",
]
