"""Named defaults. Units are in the comment beside each value."""

# Settings (docs/guarantees.md, "Settings and their defaults"); durations are seconds in the
# Python API and milliseconds inside Redis.
DEFAULT_ACK_WAIT = 30.0  # seconds a delivery is leased before redelivery
DEFAULT_MAX_INFLIGHT = 1024  # unacked deliveries per group
DEFAULT_PREFETCH = 100  # unacked deliveries per consumer
DEFAULT_MAX_DELIVERIES = 10  # deliveries before dead-lettering; -1 = unlimited
DEFAULT_REDELIVERY_DELAY = 0.0  # seconds before a failed message is offered again
DEFAULT_REDELIVERY_MULTIPLIER = 1.0  # factor applied per further redelivery
MAX_REDELIVERY_DELAY_FACTOR = 10  # default cap = redelivery_delay x this
DEFAULT_REDELIVERY_JITTER = 0.0  # fraction 0..1 of the delay, +/-
DEFAULT_DEDUP_WINDOW = 120.0  # seconds a message id is remembered
DEFAULT_MAX_PAYLOAD = 1024 * 1024  # bytes of payload per message
DEFAULT_DEAD_LETTER = "dlq"  # "dlq" keeps dead letters, "none" drops them

# Client behaviour.
DEFAULT_PREFIX = "rq"  # first part of every Redis key rqueue writes
DEFAULT_DLQ_PREFIX = "DLQ."  # name of a queue's dead-letter queue = prefix + name + suffix
DEFAULT_DLQ_SUFFIX = ""
SETTINGS_CACHE_TTL = 1.0  # seconds a process reuses settings read from Redis
IDLE_POLL_INTERVAL = 0.5  # seconds an idle fetch waits at most between checks
MIN_SERVER_VERSION = (6, 2)  # oldest Redis whose scripting rqueue relies on
FAILOVER_TIMEOUT = 20.0  # seconds a cluster client retries through a failover (> cluster-node-timeout + election)
DURABLE_REPLICAS = 1  # replicas that must acknowledge a durable publish
DURABLE_TIMEOUT = 5.0  # seconds a durable publish waits for replicas and fsync

# Limits on input.
MAX_NAME_LENGTH = 200  # characters of a queue, group or consumer name
MAX_ID_LENGTH = 512  # characters of a message id
MAX_HEADER_BYTES = 64 * 1024  # bytes of encoded headers per message
MAX_REASON_LENGTH = 1024  # characters of a term()/reject() reason or error text
MAX_FETCH = 10_000  # deliveries one fetch may ask for
MAX_BATCH = 5_000  # messages one publish_many call sends in one script call
MAX_PARTITIONS = 1024  # partitions of one partitioned queue
PURGE_BATCH = 5_000  # messages one purge script call settles at most
RETAIN_STEP = 5_000  # seqs one trim step of retention passes at most
RETAIN_INTERVAL = 0.1  # seconds between a publisher's trim steps of a queue in retention mode
RETAIN_CHECK = 10.0  # seconds between a publisher's checks of a queue not in retention mode
# Seconds of the longest duration or window a user can set (delays, ack_wait,
# redelivery delays, dedup_window, liveness, worker timeouts): 10 years, far
# inside what the scripts and Python's waits can represent (validate.py).
MAX_DURATION = 10 * 365 * 24 * 3600.0  # seconds

# Worker runtime.
DEFAULT_CONCURRENCY = 8  # handler threads per worker
# Deliveries per handler thread a worker holds at first when its prefetch is
# left to it (running or waiting for a thread): a fetch is shared by more
# messages, as Dramatiq's prefetch of twice its threads; waiting leases are
# kept alive by the heartbeat.
WORKER_PREFETCH_PER_THREAD = 2  # deliveries per handler thread
# The most a worker whose prefetch is left to it holds: its window grows up
# to this while quick handlers finish faster than a round trip brings more
# (rqueue/worker/window.py).
ADAPTIVE_PREFETCH_CAP = 256  # deliveries
DEFAULT_HEARTBEAT_INTERVAL = 1.0  # seconds between a worker's heartbeats
DEFAULT_HEARTBEAT_TIMEOUT = 5.0  # seconds of silence before a member is removed
DEFAULT_MAX_RUN_TIME = 3600.0  # seconds a handler's lease is kept alive at most
DEFAULT_GRACE_PERIOD = 30.0  # seconds running handlers get to finish on SIGTERM
DEFAULT_RECONNECT_TIMEOUT = 60.0  # seconds a worker keeps retrying a lost Redis
STALE_DISPATCH_FRACTION = 0.5  # of min(ack_wait, heartbeat timeout): older fetches are re-checked before running

DEFAULT_RESULT_TTL = 86_400.0  # seconds a handler's stored result lives (the result_ttl setting)
