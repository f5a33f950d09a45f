"""Encoding of message records (written by the scripts, lua/includes/record.lua):

- compact: ``~`` then published_ms as 6 bytes, big-endian, then the payload,
  for a message without headers and without delay;
- text: ``<not_before_ms>:<published_ms>:<headers_len>:<headers_json><payload>``.

A stream log (lua/includes/log.lua) keeps a compact record as an entry
``<seq>-<published_ms>`` with one field ``p``, the payload: the scripts
make the record again for fetch, and compact_record for the client's reads.
A fetch's claimed entries reach the consumer as SplitRecord pairs
(published_ms, payload), the compact record already taken apart: the
client makes no record only to cut it up again.

Payloads are bytes and stay bytes; headers are a JSON object of str to str.
Nothing is ever unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..constants import MAX_HEADER_BYTES
from ..errors import CorruptRecord, InvalidInput

Headers = dict[str, str]
# A compact record as a stream entry gives it: (published_ms, payload).
SplitRecord = tuple[int, bytes]

COMPACT_TAG = b"~"  # first byte of a compact record
COMPACT_HEAD = 7  # bytes before a compact record's payload: the tag, 6 of published_ms


def compact_record(published_ms: int, payload: bytes) -> bytes:
    """The compact record of a payload published at ``published_ms``."""
    return COMPACT_TAG + published_ms.to_bytes(COMPACT_HEAD - 1, "big") + payload


def encode_body(payload: bytes, headers: Mapping[str, str] | None) -> tuple[int, bytes]:
    """The part of a record the client sends: (headers_len, ``<headers_json><payload>``)."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise InvalidInput(f"payload must be bytes, not {type(payload).__name__} (encode str payloads yourself)")
    if not headers:
        return 0, bytes(payload)
    if not isinstance(headers, Mapping):
        raise InvalidInput(f"headers must be a mapping of str to str, not {type(headers).__name__}")
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidInput(f"header {k!r}: {v!r} is not str to str")
    try:
        encoded = json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"headers {dict(headers)!r} cannot be encoded as UTF-8: {exc.reason}") from None
    if len(encoded) > MAX_HEADER_BYTES:
        raise InvalidInput(f"headers encode to {len(encoded)} bytes, over the limit of {MAX_HEADER_BYTES}")
    return len(encoded), encoded + payload


def not_before(record: bytes, where: str) -> int | None:
    """The time (ms) before which a stored record (not compact) may not be
    handed out, None when its head names none (it was published without a
    delay). Raises CorruptRecord, naming ``where``, for a head that names
    something else."""
    end = record.find(b":")
    head = record[:end]
    if end == 0:
        return None
    if end < 0 or not head.isdigit():
        raise CorruptRecord(where, f"its not-before {head[:40]!r} is no time in ms; first bytes {record[:40]!r}")
    return int(head)


def decode_record(record: bytes | SplitRecord, where: str) -> tuple[int, Headers, bytes]:
    """Splits a stored record (or takes a SplitRecord) into (published_ms,
    headers, payload).

    Raises CorruptRecord, naming ``where``, for anything rqueue did not write.
    """
    if isinstance(record, tuple):
        return record[0], {}, record[1]
    if record[:1] == COMPACT_TAG:
        if len(record) < COMPACT_HEAD:
            raise CorruptRecord(where, f"a compact record of {len(record)} bytes has no full head; bytes {record!r}")
        return int.from_bytes(record[1:COMPACT_HEAD], "big"), {}, record[COMPACT_HEAD:]
    try:
        _nbf, published, hlen_raw, rest = record.split(b":", 3)
        hlen = int(hlen_raw)
        if hlen == 0:
            return int(published), {}, rest
        # Replaced, not refused: a text an older rqueue cut inside a UTF-8
        # character would make the whole record unreadable.
        headers = json.loads(rest[:hlen].decode(errors="replace"))
        if not isinstance(headers, dict) or len(rest) < hlen:
            raise ValueError("headers are not a JSON object")
        return int(published), headers, rest[hlen:]
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecord(where, f"{exc}; first bytes {record[:40]!r}") from None
