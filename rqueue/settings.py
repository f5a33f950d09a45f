"""Queue settings: defaults, validation, pattern resolution and the Redis
store that makes every process see the same settings.

Patterns follow Artemis address-settings: words split on ``.``, ``*`` matches
one word, ``#`` any number of words. When several patterns match, each
setting comes from the most specific pattern that sets it (an exact name
beats any wildcard); arguments given in code beat patterns.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .connection.open import RedisClient
from .constants import (
    DEFAULT_ACK_WAIT,
    DEFAULT_DEAD_LETTER,
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_PREFETCH,
    DEFAULT_REDELIVERY_DELAY,
    DEFAULT_REDELIVERY_JITTER,
    DEFAULT_REDELIVERY_MULTIPLIER,
    DEFAULT_RESULT_TTL,
    MAX_DURATION,
    MAX_REDELIVERY_DELAY_FACTOR,
    SETTINGS_CACHE_TTL,
)
from .engine import store
from .errors import InvalidName, InvalidSetting, show
from .events import EventKind
from .names import check_name, check_pattern
from .validate import limit_text, payload_limit

DEAD_LETTER_MODES = ("dlq", "none")


@dataclass(frozen=True)
class Settings:
    """Resolved settings of one queue. Durations are seconds."""

    ack_wait: float = DEFAULT_ACK_WAIT
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    prefetch: int = DEFAULT_PREFETCH
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    redelivery_delay: float = DEFAULT_REDELIVERY_DELAY
    redelivery_multiplier: float = DEFAULT_REDELIVERY_MULTIPLIER
    max_redelivery_delay: float | None = None  # None = redelivery_delay x 10, at most MAX_DURATION
    redelivery_jitter: float = DEFAULT_REDELIVERY_JITTER
    dead_letter: str = DEFAULT_DEAD_LETTER  # "dlq", "none" or a queue name
    alternate: str | None = None  # queue that takes unroutable mandatory publishes
    dedup_window: float = DEFAULT_DEDUP_WINDOW
    max_payload: int = DEFAULT_MAX_PAYLOAD
    # At most rate_limit deliveries per rate_period seconds per group (0: no
    # limit), in any window of that length, across every consumer.
    rate_limit: int = 0
    rate_period: float = 1.0
    # Ordering keys (publish(key=), docs/flow-control.md): at most
    # key_concurrency deliveries of one key unsettled per group, and at most
    # key_rate_limit of one key per key_rate_period seconds (0: no limit).
    key_concurrency: int = 1
    key_rate_limit: int = 0
    key_rate_period: float = 1.0
    max_age: float | None = None  # seconds settled messages are kept (docs/retention.md); None = not by age
    max_length: int | None = None  # newest seqs kept once settled; None = not by length
    results: bool = False  # workers keep each handler's return value (docs/results.md)
    # An idle consumer waits in Redis for the queue's wake-up, its next fetch
    # pipelined behind (docs/design.md, "Wake-ups"), not on the channel.
    wait_in_redis: bool = False
    result_ttl: float = DEFAULT_RESULT_TTL  # seconds a kept result lives
    events: tuple[str, ...] = ()  # lifecycle event kinds recorded besides the always-on ones
    # Seconds after its publish a message expires when handed out (dead-lettered
    # as "expired"; docs/lifecycle.md); publish(ttl=) sets it per message. None: never.
    ttl: float | None = None
    # Seconds after its publish a failed attempt dead-letters a message
    # ("deadline") instead of offering it again. None: only max_deliveries.
    retry_deadline: float | None = None

    def merged(self, values: Mapping[str, Any]) -> Settings:
        """A copy with ``values`` applied after validating each of them."""
        return replace(self, **validate(values))

    @property
    def effective_max_redelivery_delay(self) -> float:
        if self.max_redelivery_delay is None:
            # bounded as a cap set by hand is: the scripts add it to now
            return min(self.redelivery_delay * MAX_REDELIVERY_DELAY_FACTOR, MAX_DURATION)
        return self.max_redelivery_delay

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


SETTING_NAMES = frozenset(f.name for f in fields(Settings))


_LARGEST = 2**53  # largest setting value; Lua numbers are doubles, exact up to here


def _number(name: str, value: Any, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSetting(name, value, f"must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidSetting(name, value, "must be finite")
    # Checked before any float conversion: an int too large for a float would
    # raise OverflowError, and the scripts compute in doubles.
    if abs(value) > _LARGEST:
        raise InvalidSetting(name, value, f"is too large (the limit is {_LARGEST})")
    if integer and value != int(value):
        raise InvalidSetting(name, value, "must be a whole number")
    return value


def _at_least(name: str, value: Any, low: float, *, integer: bool = False, what: str = "") -> Any:
    v = _number(name, value, integer=integer)
    if v < low:
        raise InvalidSetting(name, value, what or f"must be >= {low}")
    return int(v) if integer else float(v)


def _duration(name: str, value: Any, low: float, what: str) -> float:
    """A number of seconds from ``low`` to MAX_DURATION (see validate.py for
    what the scripts can represent)."""
    finite = not isinstance(value, float) or math.isfinite(value)
    if not isinstance(value, bool) and isinstance(value, (int, float)) and finite and value > MAX_DURATION:
        # before _number's 2^53, which is not the limit of a duration
        raise InvalidSetting(name, value, f"is over the limit of {limit_text()}, the longest duration rqueue accepts")
    v: float = _at_least(name, value, low, what=what)
    return v


def _queue_name(setting: str, value: Any, what: str) -> str:
    try:
        return check_name("queue", value)
    except InvalidName as exc:
        raise InvalidSetting(setting, value, f"{what} ({exc})") from None


def _check_one(name: str, value: Any) -> Any:
    if name == "ack_wait":
        return _duration(name, value, 0.001, "must be a positive number of seconds (at least 0.001)")
    if name in ("max_inflight", "prefetch"):
        return _at_least(name, value, 1, integer=True, what="must be a whole number >= 1")
    if name == "max_deliveries":
        v = _number(name, value, integer=True)
        if v == 0 or v < -1:
            raise InvalidSetting(name, value, "must be >= 1, or -1 for unlimited")
        return int(v)
    if name in ("redelivery_delay", "dedup_window"):
        return _duration(name, value, 0, "must not be negative (seconds)")
    if name == "max_redelivery_delay":
        if value is None:
            return None
        return _duration(name, value, 0, "must not be negative (seconds)")
    if name == "redelivery_multiplier":
        return _at_least(name, value, 1, what="must be >= 1.0")
    if name == "redelivery_jitter":
        v = _number(name, value)
        if not 0 <= v <= 1:
            raise InvalidSetting(name, value, "must be between 0 and 1")
        return float(v)
    if name == "dead_letter":
        if value is None:
            return "none"
        if value in DEAD_LETTER_MODES:
            return value
        return _queue_name(name, value, f"must be {' or '.join(DEAD_LETTER_MODES)}, None, or a queue name")
    if name == "alternate":
        return None if value is None else _queue_name(name, value, "must be None or a queue name")
    if name == "rate_limit":
        return _at_least(name, value, 0, integer=True, what="must be a whole number >= 0 (0: no limit)")
    if name == "rate_period":
        return _duration(name, value, 0.001, "must be a positive number of seconds (at least 0.001)")
    if name == "key_concurrency":
        return _at_least(name, value, 1, integer=True, what="must be a whole number >= 1")
    if name == "key_rate_limit":
        return _at_least(name, value, 0, integer=True, what="must be a whole number >= 0 (0: no limit)")
    if name == "key_rate_period":
        return _duration(name, value, 0.001, "must be a positive number of seconds (at least 0.001)")
    if name in ("ttl", "retry_deadline"):
        return None if value is None else _duration(name, value, 0.001, "must be None or seconds (at least 0.001)")
    if name == "max_age":
        return None if value is None else _duration(name, value, 0, "must be None or seconds >= 0")
    if name == "max_length":
        if value is None:
            return None
        return _at_least(name, value, 0, integer=True, what="must be None or a whole number of messages >= 0")
    if name in ("results", "wait_in_redis"):
        if not isinstance(value, bool):
            raise InvalidSetting(name, value, "must be true or false")
        return value
    if name == "result_ttl":
        return _duration(name, value, 0.001, "must be a positive number of seconds (at least 0.001)")
    if name == "events":
        return _event_kinds(name, value)
    if name == "max_payload":
        return payload_limit(name, _at_least(name, value, 1, integer=True, what="must be a whole number of bytes >= 1"))
    raise InvalidSetting(name, value, f"unknown setting; known: {', '.join(sorted(SETTING_NAMES))}")


def _event_kinds(name: str, value: Any) -> tuple[str, ...]:
    """A list of lifecycle event kinds (EventKind values), or "all"."""
    known = [k.value for k in EventKind]
    if value == "all":
        return tuple(known)
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidSetting(name, value, f'must be a list of event kinds ({", ".join(known)}) or "all"')
    for kind in value:
        if kind not in known:
            raise InvalidSetting(name, value, f"{show(kind)} is no event kind; known: {', '.join(known)}")
    return tuple(k for k in known if k in value)


def validate(values: Mapping[str, Any]) -> dict[str, Any]:
    """Checks every setting in ``values``; returns them normalised.

    Raises InvalidSetting naming the first bad one; nothing is applied then.
    """
    out = {name: _check_one(name, value) for name, value in values.items()}
    delay = out.get("redelivery_delay")
    cap = out.get("max_redelivery_delay")
    if delay is not None and cap is not None and cap < delay:
        raise InvalidSetting("max_redelivery_delay", cap, f"must be >= redelivery_delay ({delay})")
    return out


def pattern_matches(pattern: str, name: str) -> bool:
    """True when the settings ``pattern`` matches the queue ``name``."""
    return _match(pattern.split("."), name.split("."))


def _match(pat: list[str], words: list[str]) -> bool:
    if not pat:
        return not words
    head, rest = pat[0], pat[1:]
    if head == "#":
        return any(_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match(rest, words[1:])


def specificity(pattern: str) -> tuple[int, int, int, int]:
    """Sort key: higher is more specific. Exact names first, then more literal
    words, then fewer ``#``, then fewer ``*``."""
    words = pattern.split(".")
    hashes = words.count("#")
    stars = words.count("*")
    exact = 1 if hashes == stars == 0 else 0
    return (exact, len(words) - hashes - stars, -hashes, -stars)


def resolve(patterns: Mapping[str, Mapping[str, Any]], name: str) -> tuple[Settings, dict[str, str]]:
    """Settings of queue ``name`` from stored patterns, and which pattern set
    each setting that is not a default."""
    matching = sorted((p for p in patterns if pattern_matches(p, name)), key=specificity)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for p in matching:  # least specific first, so the most specific wins
        for k, v in patterns[p].items():
            values[k] = v
            origin[k] = p
    try:
        return Settings().merged(values), origin
    except InvalidSetting as exc:
        cap_from, delay_from = origin.get("max_redelivery_delay"), origin.get("redelivery_delay")
        if exc.setting != "max_redelivery_delay" or cap_from is None or delay_from is None or cap_from == delay_from:
            stored_by = origin.get(exc.setting)
            if stored_by is None:
                raise
            # A value stored before its limit existed, or by another client:
            # say where it is, so that it can be changed or unset.
            head = f"invalid setting {exc.setting}={show(exc.value)}: "
            why = str(exc)[len(head) :] if str(exc).startswith(head) else str(exc)
            raise InvalidSetting(
                exc.setting,
                exc.value,
                f"{why} (stored for pattern {stored_by!r}, which applies to queue {name!r}: "
                "change it with configure() or remove it with unset())",
            ) from None
        # Each pattern was valid alone; say which two disagree for this queue.
        raise InvalidSetting(
            "max_redelivery_delay",
            values["max_redelivery_delay"],
            f"set by pattern {cap_from!r}, is below redelivery_delay={values['redelivery_delay']!r} "
            f"set by pattern {delay_from!r} (both apply to queue {name!r})",
        ) from None


def _check_overlaps(patterns: Mapping[str, Mapping[str, Any]], changed: str) -> None:
    """Raises InvalidSetting when the settings of ``changed`` combine with
    another pattern's into an invalid set for some queue (a delay from one
    pattern above the cap of another).

    Each stored pattern, read as a queue name, stands for the queues it
    names; those that ``changed`` applies to are resolved. This finds
    conflicts between ``changed`` and the patterns that contain it or that
    it contains; two patterns that only partly overlap (``a.*`` and
    ``*.b``) are reported by :func:`resolve` when a queue they share is used.
    """
    for sample in patterns:
        if pattern_matches(changed, sample):
            resolve(patterns, sample)


class SettingsStore:
    """Pattern settings kept in Redis (one hash), cached for a short time.

    Every process reads the same hash; a change made with :meth:`configure`
    reaches other processes within ``ttl`` seconds.
    """

    def __init__(
        self,
        redis: RedisClient,
        prefix: str,
        now: Callable[[], float],
        ttl: float = SETTINGS_CACHE_TTL,
        retry: Callable[[Callable[[], Any]], Any] = lambda call: call(),
    ) -> None:
        self._redis = redis
        self._retry = retry  # reads are safe to send again (a cluster retries them through a failover)
        self._prefix = prefix
        self._now = now
        #: Seconds a read of the settings is reused.
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cached: dict[str, dict[str, Any]] | None = None
        self._read_at = 0.0
        # queue name -> (the patterns it was resolved from, the result)
        self._resolved: dict[str, tuple[dict[str, dict[str, Any]], tuple[Settings, dict[str, str]]]] = {}

    def configure(self, pattern: str, values: Mapping[str, Any]) -> None:
        """Validates and stores ``values`` for ``pattern`` (merged with what
        the pattern already had)."""
        check_pattern(pattern)
        if not values:
            raise InvalidSetting("(none)", None, "configure() needs at least one setting")
        checked = validate(values)
        stored = self.patterns(fresh=True)
        current = stored.get(pattern, {})
        validate({**current, **checked})  # e.g. a new delay above a stored cap
        if "redelivery_delay" in checked or "max_redelivery_delay" in checked:
            _check_overlaps({**stored, pattern: {**current, **checked}}, pattern)
        store.write_settings(self._redis, self._prefix, {f"{pattern} {k}": json.dumps(v) for k, v in checked.items()})
        self._invalidate()

    def unset(self, pattern: str, *names: str) -> None:
        """Removes settings of ``pattern`` (all of them when no name is given)."""
        check_pattern(pattern)
        for n in names:
            if n not in SETTING_NAMES:
                raise InvalidSetting(n, None, f"unknown setting; known: {', '.join(sorted(SETTING_NAMES))}")
        stored = self.patterns(fresh=True)
        targets = names or tuple(stored.get(pattern, {}))
        if {"redelivery_delay", "max_redelivery_delay"} & set(targets):
            # e.g. removing a specific pattern's delay lets a broader one's
            # delay meet the specific cap
            left = {k: v for k, v in stored.get(pattern, {}).items() if k not in targets}
            _check_overlaps({**stored, pattern: left}, pattern)
        if targets:
            store.delete_settings(self._redis, self._prefix, [f"{pattern} {n}" for n in targets])
        self._invalidate()

    def patterns(self, fresh: bool = False) -> dict[str, dict[str, Any]]:
        """Every stored pattern with its settings."""
        with self._lock:
            if not fresh and self._cached is not None and self._now() - self._read_at < self.ttl:
                return self._cached
        raw = store.read_settings(self._redis, self._prefix, self._retry)
        parsed: dict[str, dict[str, Any]] = {}
        for field, value in raw.items():
            pattern, _, name = field.rpartition(" ")
            parsed.setdefault(pattern, {})[name] = json.loads(value)
        with self._lock:
            self._cached, self._read_at = parsed, self._now()
        return parsed

    def resolve(self, name: str) -> tuple[Settings, dict[str, str]]:
        """Settings of queue ``name`` and the pattern that set each; the same
        objects are returned while the stored patterns are unchanged."""
        patterns = self.patterns()
        hit = self._resolved.get(name)
        if hit is not None and hit[0] is patterns:
            return hit[1]
        result = resolve(patterns, name)
        self._resolved[name] = (patterns, result)
        return result

    def _invalidate(self) -> None:
        with self._lock:
            self._cached = None
