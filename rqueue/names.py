"""Validation of the names and ids users pass in. Each check raises an error
that names the bad input; nothing reaches Redis before it passes."""

from __future__ import annotations

import re
import unicodedata

from .constants import MAX_ID_LENGTH, MAX_NAME_LENGTH
from .errors import InvalidInput, InvalidName, show

# Braces would break the {queue} hash tag; whitespace and control characters
# make names that cannot be typed or shown.
_FORBIDDEN = re.compile(r"[{}\s\x00-\x1f\x7f]")
# Beyond ASCII: C1 control characters (Cc), invisible format characters such
# as zero-width spaces and direction overrides (Cf), and lone surrogates (Cs),
# which cannot even be encoded as UTF-8 to be sent to Redis.
_FORBIDDEN_CATEGORIES = {"Cc": "a control character", "Cf": "an invisible format character", "Cs": "a lone surrogate"}


def _forbidden_char(name: str) -> str | None:
    """Why ``name`` is not allowed, naming its first forbidden character, or None."""
    bad = _FORBIDDEN.search(name)
    if bad:
        return f"contains {bad.group()!r} (braces, whitespace and control characters are not allowed)"
    if not name.isascii():
        for i, ch in enumerate(name):
            what = _FORBIDDEN_CATEGORIES.get(unicodedata.category(ch))
            if what is not None:
                return (
                    f"contains {ch!r} at position {i}, {what} "
                    "(braces, whitespace and control characters are not allowed)"
                )
    return None


def check_name(kind: str, name: object) -> str:
    """Returns ``name`` when it is a usable queue, group or consumer name."""
    if not isinstance(name, str):
        raise InvalidName(kind, name, f"must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidName(kind, name, "must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(kind, name, f"is {len(name)} characters long, the limit is {MAX_NAME_LENGTH}")
    why = _forbidden_char(name)
    if why is not None:
        raise InvalidName(kind, name, why)
    return name


def check_pattern(pattern: object) -> str:
    """Returns ``pattern`` when it is a valid settings pattern (words split by
    ``.``, ``*`` = one word, ``#`` = any number of words)."""
    check_name("pattern", pattern)
    assert isinstance(pattern, str)
    for word in pattern.split("."):
        if not word:
            raise InvalidName("pattern", pattern, "has an empty word (two dots in a row, or a dot at an end)")
        if ("*" in word or "#" in word) and len(word) > 1:
            raise InvalidName("pattern", pattern, f"word {word!r} mixes a wildcard with other characters")
    return pattern


def check_message_id(msg_id: object) -> str:
    """Returns the id as a str ("" for None) when it is a usable de-duplication id."""
    if msg_id is None:
        return ""
    if not isinstance(msg_id, str):
        raise InvalidInput(f"message id {msg_id!r} must be a str, not {type(msg_id).__name__}")
    if not msg_id:
        raise InvalidInput("message id must not be empty (pass None for no id)")
    if len(msg_id) > MAX_ID_LENGTH:
        raise InvalidInput(f"message id of {len(msg_id)} characters is over the limit of {MAX_ID_LENGTH}")
    try:
        msg_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"message id {msg_id!r} cannot be encoded as UTF-8 ({exc.reason} at position {exc.start})"
        ) from None
    return msg_id


def dead_letter_root(name: str, dlq_prefix: str, dlq_suffix: str) -> tuple[str, int]:
    """The queue whose dead-letter queue ``name`` is, and how many levels
    down (``"DLQ.DLQ.orders"``: ``("orders", 2)``); ``(name, 0)`` for a name
    that is no dead-letter queue's. What is left may be empty of anything
    but the prefix and suffix (``"DLQ."``): :func:`check_queue_name` refuses it."""
    root, depth = name, 0
    while root.startswith(dlq_prefix) and root.endswith(dlq_suffix) and len(root) > len(dlq_prefix) + len(dlq_suffix):
        root, depth = root[len(dlq_prefix) : len(root) - len(dlq_suffix)], depth + 1
    return root, depth


def check_queue_name(name: object, dlq_prefix: str, dlq_suffix: str) -> str:
    """Returns ``name`` when it is a usable queue name for a client whose
    dead-letter queues are named ``dlq_prefix + name + dlq_suffix``: a valid
    name whose dead-letter queue's name is valid too, so that stats(),
    dead_letters() and replay can open it.

    A dead-letter queue's name (``DLQ.orders``, ``DLQ.DLQ.orders``) is made
    from its queue's, so it is judged by that queue: its length may pass
    MAX_NAME_LENGTH when the queue's own dead-letter name does not, and the
    dead-letter queue of every accepted name is accepted, however deep."""
    if not isinstance(name, str) or not name:
        return check_name("queue", name)  # raises, naming what is wrong
    root, depth = dead_letter_root(name, dlq_prefix, dlq_suffix)
    if root.startswith(dlq_prefix) and root.endswith(dlq_suffix) and len(root) <= len(dlq_prefix) + len(dlq_suffix):
        marker = " and ".join(
            f"{what} {text!r}" for what, text in (("prefix", dlq_prefix), ("suffix", dlq_suffix)) if text
        )
        raise InvalidName("queue", name, f"is only the dead-letter {marker}")
    if depth == 0:
        check_name("queue", name)
    else:
        why = _forbidden_char(name)
        if why is not None:
            raise InvalidName("queue", name, why)
    dead = dlq_prefix + root + dlq_suffix
    naming = f"dlq_prefix {dlq_prefix!r} and dlq_suffix {dlq_suffix!r}"
    if len(dead) > MAX_NAME_LENGTH:
        longest = MAX_NAME_LENGTH - len(dlq_prefix) - len(dlq_suffix)
        whose = (
            "its dead-letter queue"
            if depth == 0
            else f"it is a dead-letter queue of {show(root)}, whose dead-letter queue"
        )
        raise InvalidName(
            "queue",
            name,
            f"{whose} would be named with {len(dead)} characters, over the limit of {MAX_NAME_LENGTH}; "
            f"with {naming} a queue name may have up to {longest} characters",
        )
    why = _forbidden_char(dead)
    if why is not None:
        raise InvalidName("queue", name, f"its dead-letter queue's name {show(dead)} {why}; check {naming}")
    return name
