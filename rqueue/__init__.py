"""rqueue: a Redis-backed distributed work queue.

Every state change is one Lua script that runs atomically inside Redis; this
package is the thin client around them. See README.md and docs/.
"""

from .client import Client, connect
from .clock import Clock, ManualClock
from .consumer import Consumer
from .delivery import Delivery, HeartbeatResult
from .errors import (
    AlreadyAcked,
    ConnectionFailed,
    ConnectionLost,
    CorruptRecord,
    DeliveryError,
    EvictionPolicy,
    GroupInUse,
    InvalidInput,
    InvalidName,
    InvalidSetting,
    InvalidURL,
    LossKind,
    LostDelivery,
    NotDurable,
    NotHeld,
    NotMember,
    NotPermitted,
    NotSettled,
    OutOfMemory,
    PartialPublish,
    PayloadTooLarge,
    QueueInUse,
    QueuePartitioned,
    QueuePaused,
    Reject,
    ResultLost,
    ResultTimeout,
    RQueueError,
    ScriptsNotLoaded,
    ServerTooOld,
    StaleDelivery,
    StateLost,
    TimeLimitExceeded,
    UnknownDeliveryTag,
    Unroutable,
)
from .partitioned_consumer import PartitionedConsumer
from .partitions import PartitionedQueue
from .queue import Queue
from .randomness import Randomness
from .results import (
    ConsumerStats,
    DeadLetter,
    GroupMessageStatus,
    GroupStats,
    Message,
    MessageState,
    MessageStatus,
    PartitionPlacement,
    PlacementReport,
    PublishResult,
    QueueStats,
    ReplayResult,
)
from .retention import Start
from .schedules import Missed, ScheduleInfo
from .settings import Settings
from .stored_results import Failure, Result
from .timelimits import Cancellation, cancellation
from .worker import BatchHandler, PartitionedWorker, Worker, WorkerStats, batch_handler, worker_for

__version__ = "0.1.0"

__all__ = [
    "AlreadyAcked",
    "BatchHandler",
    "batch_handler",
    "Cancellation",
    "Client",
    "Clock",
    "ConnectionFailed",
    "ConnectionLost",
    "EvictionPolicy",
    "Consumer",
    "ConsumerStats",
    "CorruptRecord",
    "DeadLetter",
    "Delivery",
    "DeliveryError",
    "Failure",
    "GroupStats",
    "HeartbeatResult",
    "InvalidInput",
    "InvalidName",
    "InvalidSetting",
    "InvalidURL",
    "ManualClock",
    "Message",
    "NotDurable",
    "NotHeld",
    "NotMember",
    "StateLost",
    "LossKind",
    "LostDelivery",
    "NotPermitted",
    "NotSettled",
    "ScheduleInfo",
    "Missed",
    "OutOfMemory",
    "PartitionedConsumer",
    "PartitionedQueue",
    "PartitionedWorker",
    "PartialPublish",
    "QueueInUse",
    "GroupInUse",
    "PayloadTooLarge",
    "PublishResult",
    "Queue",
    "Start",
    "MessageState",
    "MessageStatus",
    "GroupMessageStatus",
    "QueueStats",
    "PartitionPlacement",
    "PlacementReport",
    "RQueueError",
    "Randomness",
    "Reject",
    "ReplayResult",
    "Result",
    "ResultLost",
    "ResultTimeout",
    "ScriptsNotLoaded",
    "ServerTooOld",
    "Settings",
    "StaleDelivery",
    "TimeLimitExceeded",
    "UnknownDeliveryTag",
    "QueuePartitioned",
    "Unroutable",
    "QueuePaused",
    "Worker",
    "WorkerStats",
    "cancellation",
    "connect",
    "worker_for",
]
