"""Large media files that cost the tests almost nothing to write: hand-built JPEGs and PNGs whose pixels are flat,
and a Matroska MJPEG file whose frames change size after its header (the media-memory tests)."""

import json
import os
import struct
import zlib

import numpy as np


def _segment(marker: int, payload: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload


def flat_jpeg(width: int, height: int, components: int = 1) -> bytes:
    """A baseline JPEG of ``width`` x ``height`` mid-grey pixels (1 component: mode L; 3: YCbCr, read as RGB)
    built by hand: its DC and AC Huffman tables each hold one 1-bit code (DC difference 0, end of block), so every
    8x8 block is two zero bits and the file stays small (16000 x 16000 grey: 1 MB) while a decoder still produces
    every pixel."""
    table = bytes([1] + [0] * 15) + b"\x00"  # one code of length 1, for symbol 0
    ids = bytes(range(1, components + 1))
    blocks = components * -(-width // 8) * -(-height // 8)
    return b"".join(
        (
            b"\xff\xd8",
            _segment(0xDB, b"\x00" + bytes([1] * 64)),  # quantization table 0
            _segment(
                0xC0,
                b"\x08"
                + struct.pack(">HH", height, width)
                + bytes([components])
                + b"".join(bytes([i, 0x11, 0]) for i in ids),
            ),
            _segment(0xC4, b"\x00" + table + b"\x10" + table),  # DC table 0, AC table 0
            _segment(0xDA, bytes([components]) + b"".join(bytes([i, 0]) for i in ids) + b"\x00\x3f\x00"),
            bytes(-(-2 * blocks // 8)),  # the scan: two zero bits per block
            b"\xff\xd9",
        )
    )


def transparent_png(width: int, height: int) -> bytes:
    """A ``width`` x ``height`` fully transparent RGBA PNG built by hand (zero rows compressed a block at a time):
    the writer never holds the pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" * (1 + 4 * width)  # filter byte 0, then the row's zero pixels
    compressor = zlib.compressobj(1)
    parts = [compressor.compress(row * 64) for _ in range(height // 64)]
    parts += [compressor.compress(row * (height % 64)), compressor.flush()]
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


def size_changing_mkv(path, later: tuple[int, int]) -> bytes:
    """An MJPEG Matroska file whose header and first frame are 64x64, then one grey frame of ``later`` (width,
    height) muxed as a pre-encoded packet."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mjpeg", rate=25)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuvj420p"
        frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 90, np.uint8), format="rgb24")
        first = [*stream.encode(frame), *stream.encode()]
        for packet in first:
            container.mux(packet)
        packet = av.Packet(flat_jpeg(*later))
        packet.stream, packet.time_base = stream, first[0].time_base
        packet.pts = packet.dts = first[0].pts + first[0].duration
        packet.duration, packet.is_keyframe = first[0].duration, True
        container.mux(packet)
    return path.read_bytes()


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def peak_growth_mb(fn, *args):
    """(``fn(*args)``, how many MB the peak RSS grew while it ran), run in a forked child of this process (its
    imports and compiled kernels already here) whose peak is reset first (``/proc/self/clear_refs``); a
    SampleSkipped comes back as ``(reason, detail)``."""
    from energon_pack.errors import SampleSkipped

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # the peak RSS starts again from the current RSS
            before = _status_kb("VmHWM")
            try:
                result = fn(*args)
            except SampleSkipped as skip:
                result = (skip.reason, skip.detail)
            os.write(write, json.dumps([result, (_status_kb("VmHWM") - before) // 1024]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and out, "the measuring child failed"
    result, grown = json.loads(out)
    return result, grown
