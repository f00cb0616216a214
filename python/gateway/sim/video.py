"""A tiny but real MP4 video: the simulator's stand-in for what a video model renders.

Clients download generated videos and play them, so the simulator hands out a real, standards-conforming
file (ISO BMFF container, one H.264 Constrained Baseline track, no audio) rather than placeholder bytes.
The picture is a background in a colour hashed from the prompt, with a white or black bar that steps one
macroblock column to the right every second (then leaves for a second before starting over), so the same
arguments always give the same bytes and different prompts give different videos.

Written by hand with the standard library only, and kept cheap: every second starts with an IDR frame
whose solid macroblocks are coded as DC-predicted Intra 16x16 with no residual when the prediction from
their neighbours is already exact, and as raw I_PCM samples otherwise; the frames in between repeat it
with P frames made of nothing but skipped macroblocks. `moov` comes before `mdat` so players can start
before the whole file has arrived.
"""

from __future__ import annotations

import hashlib
import re
import struct

MAX_SECONDS = 60
MAX_FPS = 30
MB = 16  # a macroblock's side in luma samples; width and height are whole macroblocks
MOVIE_TIMESCALE = 1000  # mvhd/tkhd durations in milliseconds
TICKS_PER_FRAME = 1000  # media timescale = fps * this, so every frame lasts a whole number of ticks
LOG2_MAX_FRAME_NUM = 5  # frame_num restarts at every IDR, once a second, and fps <= 30 < 2**5

# Constrained Baseline: constraint_set0 and constraint_set1 set (no FMO, ASO or redundant slices).
PROFILE_BASELINE = 66
CONSTRAINT_FLAGS = 0b1100_0000
# (level_idc, MaxMBPS, MaxFS) from H.264 Table A-1: the smallest level that fits is announced.
LEVELS = (
    (10, 1485, 99),
    (11, 3000, 396),
    (12, 6000, 396),
    (13, 11880, 396),
    (21, 19800, 792),
    (22, 20250, 1620),
    (30, 40500, 1620),
    (31, 108000, 3600),
    (32, 216000, 5120),
    (40, 245760, 8192),
    (42, 522240, 8704),
    (50, 589824, 22080),
    (51, 983040, 36864),
    (52, 2073600, 36864),
)

# H.264 NAL unit types and the macroblock types used.
NAL_SLICE, NAL_IDR, NAL_SPS, NAL_PPS = 1, 5, 7, 8
SLICE_P, SLICE_I = 5, 7  # the "+5" forms: every slice of the picture has this type
MB_I16X16_DC_NO_RESIDUAL = 3  # I_16x16_2_0_0: DC prediction, no coded luma AC or chroma
MB_I_PCM = 25

Colour = tuple[int, int, int]  # (Y, Cb, Cr), BT.601 limited range
GREY: Colour = (128, 128, 128)  # what intra DC prediction gives with no neighbours (8-bit samples)
WHITE: Colour = (235, 128, 128)
BLACK: Colour = (16, 128, 128)
IDENTITY_MATRIX = struct.pack(">9i", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)

# Where three more bytes of an RBSP would read as a start code, H.264 inserts 0x03 (7.4.1).
_NEEDS_EMULATION_PREVENTION = re.compile(rb"\x00\x00(?=[\x00-\x03])")


def render_mp4(prompt: str, seconds: int, width: int = 64, height: int = 64, fps: int = 8) -> bytes:
    """An MP4 file of `seconds` seconds at `fps` frames a second, `width` x `height` pixels (multiples of
    16), drawn from the prompt. Deterministic: the same arguments give the same bytes."""
    if not 1 <= seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be from 1 to {MAX_SECONDS}, not {seconds}")
    if not 1 <= fps <= MAX_FPS:
        raise ValueError(f"fps must be from 1 to {MAX_FPS}, not {fps}")
    if width < MB or height < MB or width % MB or height % MB:
        raise ValueError(f"width and height must be positive multiples of {MB}, not {width}x{height}")
    cols, rows = width // MB, height // MB
    level = _level(cols, rows, fps)

    background, bar = _palette(prompt)
    sps = _nal(3, NAL_SPS, _sps(cols, rows, fps, level))
    pps = _nal(3, NAL_PPS, _pps())
    idr_frames: dict[tuple[int, int], bytes] = {}  # by (bar column, idr_pic_id): at most 2 * (cols + 1)
    p_frames: dict[int, bytes] = {}  # by frame_num
    samples: list[bytes] = []
    sync_samples: list[int] = []  # 1-based, as stss counts
    for second in range(seconds):
        # The bar steps right once a second, then is gone for a second: the picture always changes.
        key = (second % (cols + 1), second % 2)  # consecutive IDRs need different idr_pic_ids
        if key not in idr_frames:
            picture = [[bar if col == key[0] else background for col in range(cols)] for _ in range(rows)]
            idr_frames[key] = _nal(3, NAL_IDR, _idr_slice(picture, key[1]))
        sync_samples.append(len(samples) + 1)
        samples.append(_length_prefixed(idr_frames[key]))
        for frame_num in range(1, fps):
            if frame_num not in p_frames:
                p_frames[frame_num] = _nal(2, NAL_SLICE, _skip_slice(frame_num, cols * rows))
            samples.append(_length_prefixed(p_frames[frame_num]))
    return _mp4(samples, sync_samples, width, height, fps, _avc_config(sps, pps, level))


class _BitWriter:
    """An H.264 RBSP written most significant bit first, with Exp-Golomb codes (9.1)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._pending = 0  # bits not yet a whole byte, fewer than 8 between calls
        self._count = 0

    def u(self, bits: int, value: int) -> None:
        self._pending = (self._pending << bits) | value
        self._count += bits
        while self._count >= 8:
            self._count -= 8
            self.data.append((self._pending >> self._count) & 0xFF)
        self._pending &= (1 << self._count) - 1

    def ue(self, value: int) -> None:
        code = value + 1  # written as bit_length - 1 zeros, then code itself
        self.u(2 * code.bit_length() - 1, code)

    def se(self, value: int) -> None:
        self.ue(2 * value - 1 if value > 0 else -2 * value)

    def align(self) -> None:
        """Zero bits up to the next byte boundary (pcm_alignment_zero_bit)."""
        if self._count:
            self.u(8 - self._count, 0)

    def raw(self, data: bytes) -> None:
        """Whole bytes; only after align()."""
        self.data += data

    def rbsp(self) -> bytes:
        """The bytes, closed with rbsp_trailing_bits: a one bit, then zeros to a byte boundary."""
        self.u(1, 1)
        self.align()
        return bytes(self.data)


def _nal(ref_idc: int, kind: int, rbsp: bytes) -> bytes:
    """A NAL unit: its header byte, then the RBSP with emulation prevention bytes inserted."""
    return bytes([ref_idc << 5 | kind]) + _NEEDS_EMULATION_PREVENTION.sub(b"\x00\x00\x03", rbsp)


def _length_prefixed(nal: bytes) -> bytes:
    """A sample in an MP4 'avc1' track is its NAL units, each after a 4-byte length."""
    return struct.pack(">I", len(nal)) + nal


def _level(cols: int, rows: int, fps: int) -> int:
    frame = cols * rows
    for level, max_mb_per_second, max_frame in LEVELS:
        # A level also bounds each side at sqrt(8 * MaxFS) macroblocks (A.3.1).
        if frame <= max_frame and max(cols, rows) ** 2 <= 8 * max_frame and frame * fps <= max_mb_per_second:
            return level
    raise ValueError(f"{cols * MB}x{rows * MB} at {fps} fps is beyond H.264 level 5.2")


def _palette(prompt: str) -> tuple[Colour, Colour]:
    """The background's colour from a hash of the prompt, and a bar that stands out against it."""
    red, green, blue = hashlib.blake2b(prompt.encode(), digest_size=3).digest()
    background = _ycbcr(red, green, blue)
    return background, WHITE if background[0] < 126 else BLACK


def _ycbcr(red: int, green: int, blue: int) -> Colour:
    """8-bit RGB to BT.601 limited-range Y'CbCr, the matrix the SPS announces."""
    y = 16 + (65.481 * red + 128.553 * green + 24.966 * blue) / 255
    cb = 128 + (-37.797 * red - 74.203 * green + 112.0 * blue) / 255
    cr = 128 + (112.0 * red - 93.786 * green - 18.214 * blue) / 255
    return round(y), round(cb), round(cr)


def _sps(cols: int, rows: int, fps: int, level: int) -> bytes:
    bits = _BitWriter()
    bits.u(8, PROFILE_BASELINE)
    bits.u(8, CONSTRAINT_FLAGS)
    bits.u(8, level)
    bits.ue(0)  # seq_parameter_set_id
    bits.ue(LOG2_MAX_FRAME_NUM - 4)
    bits.ue(2)  # pic_order_cnt_type 2: output order is decoding order, no POC in slice headers
    bits.ue(1)  # max_num_ref_frames: a P frame only ever repeats the frame before it
    bits.u(1, 0)  # gaps_in_frame_num_value_allowed_flag
    bits.ue(cols - 1)  # pic_width_in_mbs_minus1
    bits.ue(rows - 1)  # pic_height_in_map_units_minus1
    bits.u(1, 1)  # frame_mbs_only_flag
    bits.u(1, 1)  # direct_8x8_inference_flag
    bits.u(1, 0)  # frame_cropping_flag
    bits.u(1, 1)  # vui_parameters_present_flag
    # VUI (E.1.1): square pixels, the colour space, the frame rate, and no frame reordering, so that
    # players neither guess nor hold frames back.
    bits.u(1, 1)  # aspect_ratio_info_present_flag
    bits.u(8, 1)  # aspect_ratio_idc: 1:1
    bits.u(1, 0)  # overscan_info_present_flag
    bits.u(1, 1)  # video_signal_type_present_flag
    bits.u(3, 5)  # video_format: unspecified
    bits.u(1, 0)  # video_full_range_flag: limited range
    bits.u(1, 1)  # colour_description_present_flag
    bits.u(8, 6)  # colour_primaries: SMPTE 170M
    bits.u(8, 6)  # transfer_characteristics: SMPTE 170M
    bits.u(8, 6)  # matrix_coefficients: BT.601, as _ycbcr computes
    bits.u(1, 0)  # chroma_loc_info_present_flag
    bits.u(1, 1)  # timing_info_present_flag
    bits.u(32, 1)  # num_units_in_tick
    bits.u(32, 2 * fps)  # time_scale: two ticks a frame
    bits.u(1, 1)  # fixed_frame_rate_flag
    bits.u(1, 0)  # nal_hrd_parameters_present_flag
    bits.u(1, 0)  # vcl_hrd_parameters_present_flag
    bits.u(1, 0)  # pic_struct_present_flag
    bits.u(1, 1)  # bitstream_restriction_flag
    bits.u(1, 1)  # motion_vectors_over_pic_boundaries_flag
    bits.ue(0)  # max_bytes_per_pic_denom: no limit
    bits.ue(0)  # max_bits_per_mb_denom: no limit
    bits.ue(15)  # log2_max_mv_length_horizontal
    bits.ue(15)  # log2_max_mv_length_vertical
    bits.ue(0)  # max_num_reorder_frames
    bits.ue(1)  # max_dec_frame_buffering
    return bits.rbsp()


def _pps() -> bytes:
    bits = _BitWriter()
    bits.ue(0)  # pic_parameter_set_id
    bits.ue(0)  # seq_parameter_set_id
    bits.u(1, 0)  # entropy_coding_mode_flag: CAVLC
    bits.u(1, 0)  # bottom_field_pic_order_in_frame_present_flag
    bits.ue(0)  # num_slice_groups_minus1
    bits.ue(0)  # num_ref_idx_l0_default_active_minus1
    bits.ue(0)  # num_ref_idx_l1_default_active_minus1
    bits.u(1, 0)  # weighted_pred_flag
    bits.u(2, 0)  # weighted_bipred_idc
    bits.se(0)  # pic_init_qp_minus26
    bits.se(0)  # pic_init_qs_minus26
    bits.se(0)  # chroma_qp_index_offset
    bits.u(1, 1)  # deblocking_filter_control_present_flag: so slices can turn the filter off
    bits.u(1, 0)  # constrained_intra_pred_flag
    bits.u(1, 0)  # redundant_pic_cnt_present_flag
    return bits.rbsp()


def _idr_slice(picture: list[list[Colour]], idr_pic_id: int) -> bytes:
    """One I slice covering the picture, given as one colour per macroblock, row by row."""
    bits = _BitWriter()
    bits.ue(0)  # first_mb_in_slice
    bits.ue(SLICE_I)
    bits.ue(0)  # pic_parameter_set_id
    bits.u(LOG2_MAX_FRAME_NUM, 0)  # frame_num
    bits.ue(idr_pic_id)
    bits.u(1, 0)  # no_output_of_prior_pics_flag
    bits.u(1, 0)  # long_term_reference_flag
    bits.se(0)  # slice_qp_delta
    bits.ue(1)  # disable_deblocking_filter_idc: the filter would blur the edges of solid blocks

    pcm = [[False] * len(row) for row in picture]
    for y, row in enumerate(picture):
        for x, colour in enumerate(row):
            left = row[x - 1] if x else None
            top = picture[y - 1][x] if y else None
            if _dc_prediction_is(colour, left, top):
                bits.ue(MB_I16X16_DC_NO_RESIDUAL)
                bits.ue(0)  # intra_chroma_pred_mode: DC
                bits.se(0)  # mb_qp_delta
                # The luma DC block's coeff_token for no coefficients; its table depends on how many
                # coefficients the neighbours have, counted as 16 for I_PCM (9.2.1).
                counts = [16 if pcm[y][x - 1] else 0] if x else []
                counts += [16 if pcm[y - 1][x] else 0] if y else []
                n_c = (sum(counts) + 1) >> 1 if len(counts) == 2 else sum(counts)
                if n_c < 2:
                    bits.u(1, 0b1)
                else:  # 8 or 16: the fixed-length table
                    bits.u(6, 0b000011)
            else:
                pcm[y][x] = True
                bits.ue(MB_I_PCM)
                bits.align()
                bits.raw(_pcm_samples(colour))
    return bits.rbsp()


def _dc_prediction_is(colour: Colour, left: Colour | None, top: Colour | None) -> bool:
    """Whether Intra 16x16 DC prediction of luma, and DC prediction of each 4x4 chroma block, from the
    solid macroblocks to the left and above (None: outside the picture) give exactly `colour` (8.3.3,
    8.3.4)."""
    if left is None or top is None:
        return colour == (left or top or GREY)
    # With both neighbours, luma and two chroma blocks average them; the other two chroma blocks copy
    # one side each, so the neighbours' chroma must match outright.
    return (left[0] + top[0] + 1) >> 1 == colour[0] and left[1:] == top[1:] == colour[1:]


def _pcm_samples(colour: Colour) -> bytes:
    """An I_PCM macroblock's samples: 16x16 luma, then 8x8 Cb and 8x8 Cr (4:2:0)."""
    y, cb, cr = colour
    return bytes([y]) * 256 + bytes([cb]) * 64 + bytes([cr]) * 64


def _skip_slice(frame_num: int, macroblocks: int) -> bytes:
    """One P slice whose every macroblock is skipped: the frame repeats the one before it."""
    bits = _BitWriter()
    bits.ue(0)  # first_mb_in_slice
    bits.ue(SLICE_P)
    bits.ue(0)  # pic_parameter_set_id
    bits.u(LOG2_MAX_FRAME_NUM, frame_num)
    bits.u(1, 0)  # num_ref_idx_active_override_flag
    bits.u(1, 0)  # ref_pic_list_modification_flag_l0
    bits.u(1, 0)  # adaptive_ref_pic_marking_mode_flag: sliding window
    bits.se(0)  # slice_qp_delta
    bits.ue(1)  # disable_deblocking_filter_idc
    bits.ue(macroblocks)  # mb_skip_run: the whole picture
    return bits.rbsp()


def _avc_config(sps: bytes, pps: bytes, level: int) -> bytes:
    """The avcC record (ISO/IEC 14496-15): parameter sets out of band, 4-byte NAL lengths."""
    return (
        bytes([1, PROFILE_BASELINE, CONSTRAINT_FLAGS, level, 0xFC | 3, 0xE0 | 1])
        + struct.pack(">H", len(sps))
        + sps
        + bytes([1])
        + struct.pack(">H", len(pps))
        + pps
    )


def _box(kind: bytes, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _full_box(kind: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return _box(kind, struct.pack(">I", version << 24 | flags), *parts)


def _mp4(
    samples: list[bytes], sync_samples: list[int], width: int, height: int, fps: int, avc_config: bytes
) -> bytes:
    """The file: ftyp, moov, then mdat holding every sample in one chunk."""
    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isom", b"iso2", b"avc1", b"mp41")
    # moov's size does not depend on the chunk offset it holds, so build it once to measure it.
    moov = _moov(samples, sync_samples, width, height, fps, avc_config, chunk_offset=0)
    chunk_offset = len(ftyp) + len(moov) + 8  # past mdat's own header
    moov = _moov(samples, sync_samples, width, height, fps, avc_config, chunk_offset)
    return ftyp + moov + _box(b"mdat", *samples)


def _moov(
    samples: list[bytes],
    sync_samples: list[int],
    width: int,
    height: int,
    fps: int,
    avc_config: bytes,
    chunk_offset: int,
) -> bytes:
    count = len(samples)
    media_timescale = fps * TICKS_PER_FRAME
    movie_duration = count * MOVIE_TIMESCALE // fps
    mvhd = _full_box(
        b"mvhd",
        0,
        0,
        struct.pack(">IIII", 0, 0, MOVIE_TIMESCALE, movie_duration),  # times 0: deterministic bytes
        struct.pack(">IH10x", 0x10000, 0x100),  # rate 1.0, volume 1.0
        IDENTITY_MATRIX,
        bytes(24),  # pre_defined
        struct.pack(">I", 2),  # next_track_ID
    )
    tkhd = _full_box(
        b"tkhd",
        0,
        0x3,  # track enabled, in movie
        struct.pack(">IIII", 0, 0, 1, 0),  # times, track_ID 1, reserved
        struct.pack(">I8xhhh2x", movie_duration, 0, 0, 0),  # layer, alternate_group, volume 0 (video)
        IDENTITY_MATRIX,
        struct.pack(">II", width << 16, height << 16),
    )
    mdhd = _full_box(
        b"mdhd", 0, 0, struct.pack(">IIIIHH", 0, 0, media_timescale, count * TICKS_PER_FRAME, 0x55C4, 0)
    )  # 0x55C4: language "und"
    hdlr = _full_box(b"hdlr", 0, 0, struct.pack(">I4s12x", 0, b"vide"), b"VideoHandler\x00")
    avc1 = _box(
        b"avc1",
        struct.pack(">6xH16x", 1),  # data_reference_index 1; pre_defined and reserved
        struct.pack(">HHIIIH", width, height, 0x480000, 0x480000, 0, 1),  # 72 dpi, one frame a sample
        bytes(32),  # compressorname
        struct.pack(">Hh", 0x18, -1),  # depth: colour, no alpha
        _box(b"avcC", avc_config),
    )
    stbl = _box(
        b"stbl",
        _full_box(b"stsd", 0, 0, struct.pack(">I", 1), avc1),
        _full_box(b"stts", 0, 0, struct.pack(">III", 1, count, TICKS_PER_FRAME)),
        _full_box(b"stss", 0, 0, struct.pack(f">I{len(sync_samples)}I", len(sync_samples), *sync_samples)),
        _full_box(b"stsc", 0, 0, struct.pack(">IIII", 1, 1, count, 1)),  # one chunk with every sample
        _full_box(b"stsz", 0, 0, struct.pack(f">II{count}I", 0, count, *map(len, samples))),
        _full_box(b"stco", 0, 0, struct.pack(">II", 1, chunk_offset)),
    )
    minf = _box(
        b"minf",
        _full_box(b"vmhd", 0, 1, bytes(8)),  # graphicsmode copy, opcolor 0
        _box(b"dinf", _full_box(b"dref", 0, 0, struct.pack(">I", 1), _full_box(b"url ", 0, 1))),
        stbl,
    )
    trak = _box(b"trak", tkhd, _box(b"mdia", mdhd, hdlr, minf))
    return _box(b"moov", mvhd, trak)
