"""Facts about audio bytes that the gateway and the simulator both need."""

from __future__ import annotations

import struct


def wav_seconds(data: bytes) -> float | None:
    """The length of a RIFF/WAVE file from its header; None for anything else (other formats would
    need decoding)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, byte_rate, size = 12, 0, None
    while pos + 8 <= len(data):
        chunk, length = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        if chunk == b"fmt " and length >= 16 and pos + 24 <= len(data):
            sample_rate, declared, block_align = struct.unpack("<IIH", data[pos + 12 : pos + 22])
            # The header says the rate twice: its byte rate, and (for PCM) sample rate times frame
            # size. A decoder goes by the frames, so a byte rate that lies would shorten the
            # length held and billed: the slower of the two, where both are given.
            rates = [rate for rate in (declared, sample_rate * block_align) if rate > 0]
            byte_rate = min(rates, default=0)
        elif chunk == b"data":
            size = min(length, len(data) - pos - 8)
            break
        pos += 8 + length + (length & 1)
    return size / byte_rate if size is not None and byte_rate else None
