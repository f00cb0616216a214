"""Redis's wire protocol (RESP2), bytes only: commands encoded, replies parsed as they arrive.

gateway.redis_client speaks it over one connection per process. Replies decode as redis-py's
do without `decode_responses`: a simple string or a bulk string is `bytes`, an integer `int`, an
array a `list`, a nil bulk string or array `None`, an error reply a `ReplyError` (returned, not
raised: inside an array it is one element among others; the client raises a top-level one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, TypeAlias

# Deeper than any reply of the gateway's scripts; a stream nested deeper is not Redis's.
MAX_DEPTH: Final = 32
# The longest header line (type byte to CRLF) waited for: Redis's own are a few dozen bytes.
MAX_LINE: Final = 64 * 1024
_CRLF: Final = b"\r\n"


class ProtocolError(Exception):
    """Bytes that are not a RESP2 reply: the connection can no longer be read."""


class ReplyError(Exception):
    """An error reply: its code (the first word, "ERR", "NOSCRIPT", "READONLY", ...) and message."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.code = line.split(" ", 1)[0]
        self.line = line


Reply: TypeAlias = "bytes | int | list[Reply] | ReplyError | None"


def encode_command(args: Iterable[bytes | str | int | float]) -> bytes:
    """One command as an array of bulk strings (as redis-py encodes it: str as UTF-8, int in
    decimal, float as its repr)."""
    parts = []
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, int) and not isinstance(arg, bool):
            data = b"%d" % arg
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            raise TypeError(f"a Redis argument must be bytes, str, int or float, not {type(arg).__name__}")
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"*%d\r\n%s" % (len(parts), b"".join(parts))


class _Incomplete(Exception):
    pass


_INCOMPLETE: Final = _Incomplete()


class ReplyParser:
    """Replies out of a byte stream fed in pieces as they arrive, whole replies only."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = bytearray()  # the start of a reply not yet whole

    def feed(self, data: bytes) -> list[Reply]:
        """The replies `data` completes, in order; raises ProtocolError on bytes that are not RESP2."""
        buffer: bytes | bytearray = data
        if self._rest:
            self._rest += data
            buffer = self._rest
        replies: list[Reply] = []
        pos, end = 0, len(buffer)
        while pos < end:
            try:
                reply, pos_after = _reply(buffer, pos, 0)
            except _Incomplete:
                break
            replies.append(reply)
            pos = pos_after
        if buffer is self._rest:
            del self._rest[:pos]
        elif pos < end:
            self._rest = bytearray(buffer[pos:])
        return replies

    @property
    def pending(self) -> int:
        """Bytes of a reply not yet whole."""
        return len(self._rest)


def _line(data: bytes | bytearray, pos: int) -> tuple[bytes | bytearray, int]:
    """The header line starting after the type byte at `pos`, and where the next part starts."""
    stop = data.find(_CRLF, pos + 1)
    if stop < 0:
        if len(data) - pos > MAX_LINE:
            raise ProtocolError("a reply's header line has no end")
        raise _INCOMPLETE
    return data[pos + 1 : stop], stop + 2


def _integer(line: bytes | bytearray) -> int:
    digits = line[1:] if line[:1] == b"-" else line
    if not digits or not digits.isdigit() or not digits.isascii():
        raise ProtocolError(f"{bytes(line[:40])!r} is not an integer")
    return int(line)


def _reply(data: bytes | bytearray, pos: int, depth: int) -> tuple[Reply, int]:
    kind = data[pos]
    line, pos = _line(data, pos)
    if kind == 0x24:  # $ bulk string
        size = _integer(line)
        if size < 0:
            if size != -1:
                raise ProtocolError(f"a bulk string of length {size}")
            return None, pos
        stop = pos + size
        if len(data) < stop + 2:
            raise _INCOMPLETE
        if data[stop : stop + 2] != _CRLF:
            raise ProtocolError("a bulk string longer than its length")
        return bytes(data[pos:stop]), stop + 2
    if kind == 0x3A:  # : integer
        return _integer(line), pos
    if kind == 0x2A:  # * array
        count = _integer(line)
        if count < 0:
            if count != -1:
                raise ProtocolError(f"an array of length {count}")
            return None, pos
        if depth >= MAX_DEPTH:
            raise ProtocolError(f"arrays nested deeper than {MAX_DEPTH}")
        items: list[Reply] = []
        for _ in range(count):
            if pos >= len(data):
                raise _INCOMPLETE
            item, pos = _reply(data, pos, depth + 1)
            items.append(item)
        return items, pos
    if kind == 0x2B:  # + simple string
        return bytes(line), pos
    if kind == 0x2D:  # - error
        return ReplyError(bytes(line).decode("utf-8", "replace")), pos
    raise ProtocolError(f"a reply starting with {bytes([kind])!r}")
