"""Kafka's record compression codecs (gzip, snappy, lz4, zstd), byte-compatible with Java.

Built on ``cramjam`` only.  ``compress`` writes what Kafka's Java producer writes;
``decompress`` accepts what Kafka's Java consumer accepts (plus a little more, noted below).
Every malformed input raises :class:`CorruptRecordError` whose ``position`` is the byte
position inside the compressed input where the problem was found (0 when the native library
reports it for a whole stream).

Byte layouts read and written here (all offsets relative to the start of the compressed input):

    xerial snappy-java stream (org.xerial.snappy.SnappyOutputStream; Kafka's snappy writer)
      +0   8  magic 82 53 4E 41 50 50 59 00 ("\\x82SNAPPY\\0")
      +8   4  int32 BE version (1)                 -- not checked on read (redpanda writes LE)
      +12  4  int32 BE minimum compatible version  -- not checked on read
      +16     chunks, one per 32 KiB of input:
                4  int32 BE n = compressed length  (>= 0)
                n  one raw snappy block
              a length field equal to 82 53 4E 41 starts another 16-byte header
              (concatenated streams, accepted by snappy-java's SnappyInputStream)
    raw snappy (librdkafka, franz-go, kafkajs): used when the first 8 bytes are not the magic
      varint uncompressed length | snappy elements       (the whole input is one block)

    Kafka LZ4 frame (Lz4BlockOutputStream: a subset of LZ4 frame format v1.5.1)
      +0   4  magic 04 22 4D 18 (uint32 LE 0x184D2204)
      +4   1  FLG  bits 7-6 version (must be 01), bit 5 block independence (must be 1),
                   bit 4 block checksum, bit 3 content size, bit 2 content checksum,
                   bits 1-0 reserved (0)                                 -- written 0x60
      +5   1  BD   bit 7 reserved, bits 6-4 max block size id (4 = 64 KiB, 5 = 256 KiB,
                   6 = 1 MiB, 7 = 4 MiB), bits 3-0 reserved                -- written 0x40
      (+6  8  uint64 LE content size, present only if FLG bit 3; skipped)
      +h   1  HC   (xxh32(FLG .. end of descriptor, seed 0) >> 8) & 0xFF  -- 0x82 for 60 40;
                   magic-0 writers hashed magic .. end of descriptor instead (KAFKA-3160)
      blocks:  4  uint32 LE size; bit 31 set = data stored uncompressed
               n  data (an independent raw lz4 block, or stored bytes)
              (4  uint32 LE xxh32 of the data, only if FLG bit 4; verified)
      end:     4  00 00 00 00
              (4  uint32 LE xxh32 of the content, only if FLG bit 2; skipped, as Kafka does)

    gzip: RFC 1952 members (one written; concatenated members accepted)
    zstd: RFC 8878 frames (one written; concatenated frames and frames without the
          content-size field, as zstd-jni's streaming writer produces, accepted)
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from typing import Any

import cramjam

from pylog.storage.errors import ConfigError, CorruptRecordError

__all__ = [
    "CODEC_NAMES",
    "GZIP",
    "LZ4",
    "NONE",
    "SNAPPY",
    "ZSTD",
    "codec_id",
    "compress",
    "decompress",
]

_Data = bytes | bytearray | memoryview

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES: dict[int, str] = {
    NONE: "none",
    GZIP: "gzip",
    SNAPPY: "snappy",
    LZ4: "lz4",
    ZSTD: "zstd",
}
_CODEC_BY_NAME: dict[str, int] = {name: cid for cid, name in CODEC_NAMES.items()}
_CODEC_BY_NAME["uncompressed"] = NONE

# Levels as Kafka's GzipCompression / Lz4Compression / ZstdCompression accept them.
GZIP_DEFAULT_LEVEL = 6  # java.util.zip.Deflater.DEFAULT_COMPRESSION (-1) means zlib level 6
GZIP_LEVELS = range(1, 10)
LZ4_DEFAULT_LEVEL = 9  # Kafka: level 9 = lz4-java fastCompressor, any other = highCompressor
LZ4_LEVELS = range(1, 18)
ZSTD_DEFAULT_LEVEL = 3
ZSTD_LEVELS = range(-131072, 23)

# --- xerial snappy-java framing ---------------------------------------------------------------
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
XERIAL_CHUNK = struct.Struct(">i")  # compressed chunk length
XERIAL_HEADER_BYTES = XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)
XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java SnappyOutputStream.DEFAULT_BLOCK_SIZE
# A raw snappy element expands at most 64 / 3 times (a 3-byte copy of 64 bytes), so a block
# that declares more than this many bytes per input byte is corrupt (and is not allocated).
_SNAPPY_MAX_EXPANSION = 22

# --- Kafka LZ4 frame --------------------------------------------------------------------------
LZ4_MAGIC = 0x184D2204
LZ4_FRAME = struct.Struct("<IBB")  # magic, FLG, BD
LZ4_CONTENT_SIZE = struct.Struct("<Q")
LZ4_BLOCK = struct.Struct("<I")  # block size (bit 31: stored uncompressed); 0 = end mark
LZ4_CHECKSUM = struct.Struct("<I")  # block / content xxh32
LZ4_FLG = 0x60  # version 01, independent blocks, no checksums, no content size
LZ4_BD = 0x40  # 64 KiB maximum block size
LZ4_BLOCK_SIZE = 64 * 1024
LZ4_UNCOMPRESSED = 0x80000000
LZ4_END_MARK = LZ4_BLOCK.pack(0)
_FLG_VERSION_SHIFT = 6
_FLG_INDEPENDENT = 0x20
_FLG_BLOCK_CHECKSUM = 0x10
_FLG_CONTENT_SIZE = 0x08
_FLG_CONTENT_CHECKSUM = 0x04
_FLG_RESERVED = 0x03
_BD_RESERVED = 0x8F

# --- xxh32 (for the LZ4 header checksum and block checksums) ---------------------------------
_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _xxh32(data: _Data, seed: int = 0) -> int:
    """XXH32 of ``data`` (pure Python: used for 2-10 byte LZ4 descriptors and, only when a
    frame flags them, block checksums; Kafka's own writer never sets that flag)."""
    n = len(data)
    i = 0
    if n >= 16:
        v1 = (seed + _P1 + _P2) & _M32
        v2 = (seed + _P2) & _M32
        v3 = seed & _M32
        v4 = (seed - _P1) & _M32
        stripes = n // 16
        words = struct.unpack_from(f"<{stripes * 4}I", data)
        for j in range(0, stripes * 4, 4):
            v1 = (v1 + words[j] * _P2) & _M32
            v1 = (((v1 << 13) | (v1 >> 19)) * _P1) & _M32
            v2 = (v2 + words[j + 1] * _P2) & _M32
            v2 = (((v2 << 13) | (v2 >> 19)) * _P1) & _M32
            v3 = (v3 + words[j + 2] * _P2) & _M32
            v3 = (((v3 << 13) | (v3 >> 19)) * _P1) & _M32
            v4 = (v4 + words[j + 3] * _P2) & _M32
            v4 = (((v4 << 13) | (v4 >> 19)) * _P1) & _M32
        h = (
            ((v1 << 1) | (v1 >> 31))
            + ((v2 << 7) | (v2 >> 25))
            + ((v3 << 12) | (v3 >> 20))
            + ((v4 << 18) | (v4 >> 14))
        )
        i = stripes * 16
    else:
        h = seed + _P5
    h = (h + n) & _M32
    while i + 4 <= n:
        (word,) = LZ4_CHECKSUM.unpack_from(data, i)
        h = (h + word * _P3) & _M32
        h = (((h << 17) | (h >> 15)) * _P4) & _M32
        i += 4
    while i < n:
        h = (h + data[i] * _P5) & _M32
        h = (((h << 11) | (h >> 21)) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def _lz4_header_checksum(descriptor: _Data) -> int:
    return (_xxh32(descriptor) >> 8) & 0xFF


# 04 22 4D 18 60 40 82: the header every Kafka (>= 0.10) LZ4 frame starts with.
LZ4_KAFKA_HEADER = LZ4_FRAME.pack(LZ4_MAGIC, LZ4_FLG, LZ4_BD) + bytes(
    [_lz4_header_checksum(bytes([LZ4_FLG, LZ4_BD]))]
)


# --- public API -------------------------------------------------------------------------------


def codec_id(name_or_id: str | int) -> int:
    """The codec id for a name (``none``/``uncompressed``, ``gzip``, ``snappy``, ``lz4``,
    ``zstd``; case-insensitive) or a valid id; anything else raises :class:`ConfigError`."""
    if isinstance(name_or_id, str):
        cid = _CODEC_BY_NAME.get(name_or_id.strip().lower())
        if cid is not None:
            return cid
    elif not isinstance(name_or_id, bool):
        try:
            cid = operator.index(name_or_id)  # int, numpy integer, ...
        except TypeError:
            pass
        else:
            if cid in CODEC_NAMES:
                return cid
    valid = ", ".join(CODEC_NAMES.values())
    raise ConfigError(
        f"unknown compression codec {name_or_id!r}: valid names are {valid} (or uncompressed),"
        f" valid ids are 0-4"
    )


def compress(codec: int, data: _Data, level: int | None = None) -> bytes:
    """Compress ``data`` the way Kafka's Java producer does for ``codec``.

    ``level`` (``None`` = Kafka's default) is range-checked as Kafka does (gzip 1-9 or -1,
    lz4 1-17, zstd -131072..22); it is ignored for ``none`` and ``snappy``, which have none.
    """
    if codec == NONE:
        return data if type(data) is bytes else _view(data).tobytes()
    view = _view(data)
    if codec == GZIP:
        lvl = _level("gzip", level, GZIP_DEFAULT_LEVEL, GZIP_LEVELS, extra=-1)
        return bytes(cramjam.gzip.compress(view, level=GZIP_DEFAULT_LEVEL if lvl == -1 else lvl))
    if codec == SNAPPY:
        return _xerial_compress(view)
    if codec == LZ4:
        return _lz4_compress(view, _level("lz4", level, LZ4_DEFAULT_LEVEL, LZ4_LEVELS))
    if codec == ZSTD:
        lvl = _level("zstd", level, ZSTD_DEFAULT_LEVEL, ZSTD_LEVELS)
        return bytes(cramjam.zstd.compress(view, level=lvl))
    raise ConfigError(f"unknown compression codec id {codec!r}: valid ids are 0-4")


def decompress(codec: int, data: _Data, *, magic: int = 2, max_size: int | None = None) -> bytes:
    """Decompress a Kafka records section (magic 2) or legacy wrapper value (magic 0/1).

    Raises :class:`CorruptRecordError` for malformed input, for an unknown codec id, for zstd
    with ``magic`` < 2, and when the output would exceed ``max_size`` bytes (checked per
    block / chunk, so memory stays bounded by about ``max_size``).
    """
    if max_size is not None and max_size < 0:
        raise ConfigError(f"max_size must be >= 0, not {max_size}")
    view = _view(data)
    if codec == NONE:
        if max_size is not None and len(view) > max_size:
            raise _too_large("none", len(view), max_size, 0)
        return data if type(data) is bytes else view.tobytes()
    if codec == GZIP:
        return _native_decompress("gzip", cramjam.gzip, _GZIP_OVERFLOW, view, max_size)
    if codec == SNAPPY:
        if len(view) >= len(XERIAL_MAGIC) and view[: len(XERIAL_MAGIC)] == XERIAL_MAGIC:
            return _xerial_decompress(view, max_size)
        return _raw_snappy_decompress(view, max_size)
    if codec == LZ4:
        return _lz4_decompress(view, magic, max_size)
    if codec == ZSTD:
        if magic < 2:
            raise CorruptRecordError(
                f"zstd: compression codec id 4 (zstd) is not allowed for magic {magic} (it needs magic >= 2)",
                position=0,
            )
        return _native_decompress("zstd", cramjam.zstd, _ZSTD_OVERFLOW, view, max_size)
    raise CorruptRecordError(
        f"unknown compression codec id {codec} (valid: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)",
        position=0,
    )


# --- helpers ----------------------------------------------------------------------------------


def _view(data: _Data) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B" or not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view


def _level(name: str, level: int | None, default: int, valid: range, extra: int | None = None) -> int:
    if level is None:
        return default
    if level in valid or (extra is not None and level == extra):
        return level
    raise ConfigError(
        f"invalid {name} compression level {level}:"
        f" valid levels are {valid.start}..{valid.stop - 1}"
        + ("" if extra is None else f" (or {extra} for the default)")
    )


def _corrupt(name: str, message: str, position: int) -> CorruptRecordError:
    return CorruptRecordError(f"{name}: {message}", position=position)


def _too_large(name: str, size: int | str, max_size: int, position: int) -> CorruptRecordError:
    return _corrupt(name, f"decompressed size {size} exceeds max_size {max_size}", position)


# --- gzip and zstd: whole-stream native decoding ----------------------------------------------


def _overflow_message(module: Any) -> str | None:
    """The message cramjam gives when ``decompress_into`` runs out of output buffer.

    Probed once at import rather than hard-coded, so a reworded message in another cramjam
    version still works; if none is raised at all, a full buffer is detected by its length."""
    try:
        module.decompress_into(bytes(module.compress(b"\x00" * 64)), bytearray(1))
    except Exception as e:
        return str(e)
    return None


_GZIP_OVERFLOW = _overflow_message(cramjam.gzip)
_ZSTD_OVERFLOW = _overflow_message(cramjam.zstd)
_MIN_GUESS = 64 * 1024


def _native_decompress(
    name: str, module: Any, overflow: str | None, view: memoryview, max_size: int | None
) -> bytes:
    if max_size is None:
        try:
            return bytes(module.decompress(view))
        except Exception as e:
            raise _corrupt(name, f"invalid stream: {e}", 0) from e
    # Bounded: decode into a fixed buffer that grows 4x (to max_size + 1) while it is too small;
    # cramjam stops writing (and raises) once the buffer is full, so memory stays bounded.
    into: Callable[[memoryview, bytearray], int] = module.decompress_into
    cap = max_size + 1
    size = min(cap, max(_MIN_GUESS, 4 * len(view)))
    while True:
        out = bytearray(size)
        try:
            n = into(view, out)
        except Exception as e:
            if overflow is None or str(e) != overflow:
                raise _corrupt(name, f"invalid stream: {e}", 0) from e
            n = size
        if n < size:
            del out[n:]
            return bytes(out)
        if size >= cap:
            raise _too_large(name, f"> {max_size}", max_size, 0)
        size = min(cap, size * 4)


# --- snappy -----------------------------------------------------------------------------------


def _xerial_compress(view: memoryview) -> bytes:
    parts: list[Any] = [XERIAL_HEADER_BYTES]
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE])
        parts.append(XERIAL_CHUNK.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_block(block: memoryview, total: int, max_size: int | None, position: int) -> Any:
    """Decode one raw snappy block found at ``position``; ``total`` bytes were decoded before."""
    try:
        declared = cramjam.snappy.decompress_raw_len(block)
    except Exception as e:
        raise _corrupt("snappy", f"invalid block: {e}", position) from e
    if declared > _SNAPPY_MAX_EXPANSION * len(block):
        raise _corrupt(
            "snappy",
            f"block of {len(block)} bytes declares an impossible {declared} decompressed bytes",
            position,
        )
    if max_size is not None and total + declared > max_size:
        raise _too_large("snappy", total + declared, max_size, position)
    try:
        return cramjam.snappy.decompress_raw(block)
    except Exception as e:
        raise _corrupt("snappy", f"invalid block: {e}", position) from e


def _raw_snappy_decompress(view: memoryview, max_size: int | None) -> bytes:
    return bytes(_snappy_block(view, 0, max_size, 0))


def _xerial_decompress(view: memoryview, max_size: int | None) -> bytes:
    n = len(view)
    parts: list[Any] = []
    total = 0
    pos = 0
    while pos < n:
        # A (possibly concatenated) stream header; the caller or the chunk loop matched 4+ bytes.
        if n - pos < XERIAL_HEADER.size:
            raise _corrupt("snappy", f"truncated xerial header ({n - pos} of 16 bytes)", pos)
        magic, _version, _compatible = XERIAL_HEADER.unpack_from(view, pos)
        if magic != XERIAL_MAGIC:
            raise _corrupt("snappy", f"bad xerial magic {magic.hex(' ')}", pos)
        pos += XERIAL_HEADER.size
        while pos < n:
            if n - pos < XERIAL_CHUNK.size:
                raise _corrupt("snappy", f"truncated chunk length ({n - pos} of 4 bytes)", pos)
            if view[pos : pos + 4] == XERIAL_MAGIC[:4]:
                break  # another stream's header follows
            (length,) = XERIAL_CHUNK.unpack_from(view, pos)
            if length < 0:
                raise _corrupt("snappy", f"negative chunk length {length}", pos)
            start = pos + XERIAL_CHUNK.size
            if length > n - start:
                raise _corrupt(
                    "snappy",
                    f"chunk length {length} runs past the end of the input ({n - start} bytes left)",
                    pos,
                )
            block = _snappy_block(view[start : start + length], total, max_size, pos)
            parts.append(block)
            total += len(block)
            pos = start + length
    return b"".join(parts)


# --- lz4 --------------------------------------------------------------------------------------


def _lz4_compress(view: memoryview, level: int) -> bytes:
    kwargs: dict[str, Any] = {}
    if level != LZ4_DEFAULT_LEVEL:  # as Kafka: 9 = fast compressor, others = high compression
        kwargs = {"mode": "high_compression", "compression": level}
    parts: list[Any] = [LZ4_KAFKA_HEADER]
    for start in range(0, len(view), LZ4_BLOCK_SIZE):
        chunk = view[start : start + LZ4_BLOCK_SIZE]
        block = cramjam.lz4.compress_block(chunk, store_size=False, **kwargs)
        if len(block) < len(chunk):
            parts.append(LZ4_BLOCK.pack(len(block)))
            parts.append(block)
        else:
            parts.append(LZ4_BLOCK.pack(len(chunk) | LZ4_UNCOMPRESSED))
            parts.append(chunk)
    parts.append(LZ4_END_MARK)
    return b"".join(parts)


def _lz4_decompress(view: memoryview, magic: int, max_size: int | None) -> bytes:
    n = len(view)
    if n < LZ4_FRAME.size:
        raise _corrupt("lz4", f"truncated frame header ({n} bytes)", 0)
    frame_magic, flg, bd = LZ4_FRAME.unpack_from(view, 0)
    if frame_magic != LZ4_MAGIC:
        raise _corrupt("lz4", f"bad frame magic {view[:4].hex(' ')} (expected 04 22 4d 18)", 0)
    if flg >> _FLG_VERSION_SHIFT != 1:
        raise _corrupt("lz4", f"unsupported frame version {flg >> _FLG_VERSION_SHIFT} in FLG", 4)
    if flg & _FLG_RESERVED:
        raise _corrupt("lz4", f"reserved FLG bits set (FLG 0x{flg:02x})", 4)
    if not flg & _FLG_INDEPENDENT:
        raise _corrupt("lz4", "dependent (linked) blocks are not supported by Kafka (FLG bit 5 is 0)", 4)
    if bd & _BD_RESERVED:
        raise _corrupt("lz4", f"reserved BD bits set (BD 0x{bd:02x})", 5)
    block_id = (bd >> 4) & 0x07
    if block_id < 4:
        raise _corrupt("lz4", f"invalid maximum block size id {block_id} in BD (must be 4-7)", 5)
    max_block = 1 << (2 * block_id + 8)
    pos = LZ4_FRAME.size
    if flg & _FLG_CONTENT_SIZE:
        pos += LZ4_CONTENT_SIZE.size
    if n <= pos:
        raise _corrupt("lz4", "truncated frame descriptor", n)
    hc = view[pos]
    if hc != _lz4_header_checksum(view[4:pos]) and not (
        magic == 0 and hc == _lz4_header_checksum(view[0:pos])  # KAFKA-3160 legacy writers
    ):
        raise _corrupt("lz4", f"frame descriptor checksum mismatch (HC 0x{hc:02x})", pos)
    pos += 1

    block_checksum = bool(flg & _FLG_BLOCK_CHECKSUM)
    out = bytearray()
    scratch: bytearray | None = None
    while True:
        if n - pos < LZ4_BLOCK.size:
            raise _corrupt("lz4", "truncated frame: missing block size or end mark", pos)
        (word,) = LZ4_BLOCK.unpack_from(view, pos)
        if word == 0:
            pos += LZ4_BLOCK.size
            break
        size = word & (LZ4_UNCOMPRESSED - 1)
        start = pos + LZ4_BLOCK.size
        if size > max_block:
            raise _corrupt("lz4", f"block size {size} exceeds the maximum {max_block}", pos)
        end = start + size
        if end > n:
            raise _corrupt("lz4", f"block of {size} bytes runs past the end ({n - start} bytes left)", pos)
        block = view[start:end]
        if block_checksum:
            if n - end < LZ4_CHECKSUM.size:
                raise _corrupt("lz4", "truncated block checksum", end)
            (expected,) = LZ4_CHECKSUM.unpack_from(view, end)
            if _xxh32(block) != expected:
                raise _corrupt("lz4", "block checksum mismatch", pos)
            end += LZ4_CHECKSUM.size
        if word & LZ4_UNCOMPRESSED:
            if max_size is not None and len(out) + size > max_size:
                raise _too_large("lz4", len(out) + size, max_size, pos)
            out += block
        else:
            if scratch is None:
                scratch = bytearray(max_block)
            try:
                produced = cramjam.lz4.decompress_block_into(block, scratch)
            except Exception as e:
                raise _corrupt("lz4", f"invalid block: {e}", pos) from e
            if max_size is not None and len(out) + produced > max_size:
                raise _too_large("lz4", len(out) + produced, max_size, pos)
            out += memoryview(scratch)[:produced]
        pos = end
    if flg & _FLG_CONTENT_CHECKSUM:
        # Read but not verified, as Kafka's Lz4BlockInputStream does.
        if n - pos < LZ4_CHECKSUM.size:
            raise _corrupt("lz4", "truncated content checksum", pos)
        pos += LZ4_CHECKSUM.size
    if pos != n:
        raise _corrupt("lz4", f"{n - pos} unexpected bytes after the end mark", pos)
    return bytes(out)
