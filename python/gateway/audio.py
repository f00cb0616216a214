"""Facts about audio bytes that the gateway and the simulator both need."""

from __future__ import annotations

import struct

# The lowest bitrate compressed audio plausibly has (8 kbit/s): its size then bounds its length.
MIN_BYTES_PER_SECOND = 1000
# WAVE format tags whose frames are samples: PCM, IEEE float, and the extensible header.
PCM_TAGS = frozenset({1, 3, 0xFFFE})


def wav_seconds(data: bytes) -> float | None:
    """The length of a RIFF/WAVE file from its header; None for anything else (other formats would
    need decoding). As rust/core/src/media.rs reads one: the audio runs to the end of the file,
    whatever its `data` chunk says (a decoder reads a size of 0 so); a PCM header's rate is the
    slower of the two it gives, any other coding's the lowest plausible (MIN_BYTES_PER_SECOND)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, byte_rate = 12, 0
    while pos + 8 <= len(data):
        chunk, length = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        if chunk == b"fmt " and length >= 16 and pos + 24 <= len(data):
            tag, _, sample_rate, declared, block_align = struct.unpack("<HHIIH", data[pos + 8 : pos + 22])
            if tag in PCM_TAGS:
                # The header says the rate twice: its byte rate, and sample rate times frame size.
                # A decoder goes by the frames, so a byte rate that lies would shorten the length
                # held and billed: the slower of the two, where both are given.
                rates = [rate for rate in (declared, sample_rate * block_align) if rate > 0]
                byte_rate = min(rates, default=0)
            else:  # ADPCM and the like: frames are not samples, and the byte rate is the file's word
                byte_rate = MIN_BYTES_PER_SECOND
        elif chunk == b"data":
            size = len(data) - pos - 8
            return size / byte_rate if byte_rate else None
        pos += 8 + length + (length & 1)
    return None
