"""How a payload is shown: pretty JSON, text, or hex for binary, cut at a
limit with its full size given. The result is plain text; the templates
escape it like any other value."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

TEXT_LIMIT = 16 * 1024  # characters of text or JSON shown
HEX_LIMIT = 1024  # bytes of a binary payload shown as hex


class Kind(enum.Enum):
    JSON = "json"
    TEXT = "text"
    BINARY = "binary"
    EMPTY = "empty"


@dataclass(frozen=True)
class PayloadView:
    kind: Kind
    text: str  # what to show (never markup)
    size: int  # bytes of the whole payload
    truncated: bool


def view(data: bytes, text_limit: int = TEXT_LIMIT, hex_limit: int = HEX_LIMIT) -> PayloadView:
    """``data`` as a page shows it."""
    if not data:
        return PayloadView(Kind.EMPTY, "", 0, False)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return PayloadView(Kind.BINARY, hex_dump(data[:hex_limit]), len(data), len(data) > hex_limit)
    if any(not c.isprintable() and c not in "\n\r\t" for c in text[:text_limit]):
        return PayloadView(Kind.BINARY, hex_dump(data[:hex_limit]), len(data), len(data) > hex_limit)
    kind = Kind.TEXT
    if text.lstrip()[:1] in ("{", "[", '"') or text.strip() in ("true", "false", "null"):
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            kind = Kind.JSON
        except (ValueError, RecursionError):
            pass
    return PayloadView(kind, text[:text_limit], len(data), len(text) > text_limit)


def hex_dump(data: bytes) -> str:
    """16 bytes a line: offset, hex, and the printable ASCII beside it."""
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at : at + 16]
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:08x}  {chunk.hex(' '):<47}  {shown}")
    return "\n".join(lines)
