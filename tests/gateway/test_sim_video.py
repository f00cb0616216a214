"""The simulator's MP4 renderer: a well-formed ISO BMFF file whose timing and sample tables agree with
the arguments and with the H.264 data in it, the same bytes for the same arguments."""

from __future__ import annotations

import struct

import pytest

from gateway.sim.video import render_mp4

# Boxes that hold only other boxes, and so are walked into.
CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}


def boxes(data: bytes, start: int = 0, end: int | None = None) -> list[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of every box from start to end, checking they tile it."""
    end = len(data) if end is None else end
    found = []
    while start < end:
        size, kind = struct.unpack_from(">I4s", data, start)
        assert size >= 8 and start + size <= end, f"box {kind!r} at {start} overruns"
        found.append((kind, start + 8, start + size))
        start += size
    assert start == end
    return found


def box(data: bytes, path: str) -> bytes:
    """The payload of the box at a slash-separated path such as moov/trak/mdia/mdhd."""
    start, end = 0, len(data)
    for kind in path.encode().split(b"/"):
        matches = [(s, e) for k, s, e in boxes(data, start, end) if k == kind]
        assert len(matches) == 1, f"expected one {kind!r}"
        start, end = matches[0]
    return data[start:end]


def full_box_fields(data: bytes, path: str, fmt: str) -> tuple[int, ...]:
    """Fields after a full box's version and flags (version 0 only, as the renderer writes)."""
    payload = box(data, path)
    assert payload[0] == 0
    return struct.unpack_from(fmt, payload, 4)


def test_top_level_boxes_are_ftyp_moov_mdat_and_cover_the_file() -> None:
    data = render_mp4("a red fox", 8)
    assert [kind for kind, _, _ in boxes(data)] == [b"ftyp", b"moov", b"mdat"]
    assert box(data, "ftyp")[:4] == b"isom"
    for path in ("moov/trak/tkhd", "moov/trak/mdia/hdlr", "moov/trak/mdia/minf/stbl/stsd"):
        assert box(data, path)


@pytest.mark.parametrize(("seconds", "fps"), [(8, 8), (1, 1), (3, 30), (60, 7)])
def test_durations_and_sample_tables_match_the_arguments(seconds: int, fps: int) -> None:
    data = render_mp4("ocean waves at dusk", seconds, fps=fps)
    movie_scale, movie_duration = full_box_fields(data, "moov/mvhd", ">8xII")
    assert movie_duration == seconds * movie_scale
    media_scale, media_duration = full_box_fields(data, "moov/trak/mdia/mdhd", ">8xII")
    assert media_duration == seconds * media_scale
    (track_duration,) = full_box_fields(data, "moov/trak/tkhd", ">16xI")
    assert track_duration == movie_duration

    stbl = "moov/trak/mdia/minf/stbl/"
    entries, count, delta = full_box_fields(data, stbl + "stts", ">III")
    assert (entries, count, delta * fps) == (1, seconds * fps, media_scale)
    sample_size, sample_count = full_box_fields(data, stbl + "stsz", ">II")
    assert (sample_size, sample_count) == (0, seconds * fps)
    sizes = full_box_fields(data, stbl + "stsz", f">8x{sample_count}I")

    # One chunk holds every sample, and it is exactly mdat's payload.
    assert full_box_fields(data, stbl + "stsc", ">IIII") == (1, 1, sample_count, 1)
    _, offset = full_box_fields(data, stbl + "stco", ">II")
    (_, mdat_start, mdat_end) = boxes(data)[2]
    assert offset == mdat_start
    assert sum(sizes) == mdat_end - mdat_start

    # A sync sample (an IDR picture) starts every second, and only there.
    (sync_count,) = full_box_fields(data, stbl + "stss", ">I")
    assert full_box_fields(data, stbl + "stss", f">4x{sync_count}I") == tuple(
        range(1, seconds * fps + 1, fps)
    )
    position = offset
    for number, size in enumerate(sizes, 1):
        (nal_length,) = struct.unpack_from(">I", data, position)
        assert nal_length == size - 4  # one length-prefixed NAL unit per sample
        assert data[position + 4] & 0x1F == (5 if (number - 1) % fps == 0 else 1)
        position += size


def test_track_is_h264_at_the_requested_size() -> None:
    data = render_mp4("a red fox", 2, width=96, height=48)
    stsd = box(data, "moov/trak/mdia/minf/stbl/stsd")
    assert struct.unpack_from(">I4s", stsd, 8) == (len(stsd) - 8, b"avc1")  # the one sample entry
    assert struct.unpack_from(">HH", stsd, 16 + 24) == (96, 48)
    assert b"avcC" in stsd
    assert full_box_fields(data, "moov/trak/tkhd", ">72xII") == (96 << 16, 48 << 16)
    assert box(data, "moov/trak/mdia/hdlr")[8:12] == b"vide"


def test_same_arguments_same_bytes_and_prompts_differ() -> None:
    assert render_mp4("a red fox", 4) == render_mp4("a red fox", 4)
    assert render_mp4("a red fox", 4) != render_mp4("a blue whale", 4)
    assert len(render_mp4("a red fox", 8)) < 100_000


@pytest.mark.parametrize(
    ("seconds", "width", "height", "fps"),
    [
        (0, 64, 64, 8),
        (61, 64, 64, 8),
        (8, 60, 64, 8),
        (8, 64, 72, 8),
        (8, 0, 64, 8),
        (8, -16, 64, 8),
        (8, 64, 64, 0),
        (8, 64, 64, 31),
    ],
)
def test_bad_arguments_raise_value_error(seconds: int, width: int, height: int, fps: int) -> None:
    with pytest.raises(ValueError):
        render_mp4("a red fox", seconds, width, height, fps)
