"""Pack onnxruntime-gpu for a lent GPU machine in two carries (benchmarks/device_session.sh).

A call to the GPU machine carries at most 64 MiB, and the onnxruntime-gpu 1.31.1 wheel is
256 MB: 208 MB of it is the CUDA provider's fatbin, cubins for sm_75, 80, 86, 89, 90 and
120. This keeps the cubins of the GPU's architecture (``--arch``, 90 for the H100 and H200)
and zeroes the others' bytes in place (the fatbin's headers and the library's layout do not
change, and the CUDA runtime loads only the image for the device it runs on), then packs
the unpacked wheel as one xz tar (69 MB for sm_90) cut into parts of at most ``--part-mib``,
the first in ``.ortgpu1/`` beside onnxconverter-common's wheel (a peer the GPU machine
lacks), the second in ``.ortgpu2/``. Run here, in the repository root, with network:

    python benchmarks/pack_ortgpu.py [--version 1.31.1] [--arch 90] [--part-mib 34]

Both folders are ignored (``/.ortgpu*/`` in .git/info/exclude, which this adds); the first
call of device_session.sh carries ``.ortgpu1``, the second ``.ortgpu2``.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
ENTRY_HEADER = struct.Struct("<HHIQIIHHI")  # kind, ?, header size, payload size, ?, ?, minor, major, arch
PIP_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--platform",
                "manylinux_2_28_x86_64"]


def elf_section(data: bytes, wanted: str) -> tuple[int, int]:
    """(offset, size) of a section of a 64-bit little-endian ELF file."""
    table = struct.unpack_from("<Q", data, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, table + i * entry_size) for i in range(count)]
    names = sections[names_index][4]
    for name, _, _, _, offset, size in sections:
        if data[names + name:data.index(b"\0", names + name)].decode() == wanted:
            return offset, size
    raise SystemExit(f"no {wanted} section")


def keep_arch(library: Path, arch: int) -> tuple[int, int]:
    """Zero the payload of every fatbin entry for another architecture; (bytes kept, bytes zeroed)."""
    data = bytearray(library.read_bytes())
    start, size = elf_section(data, ".nv_fatbin")
    position, kept, zeroed = start, 0, 0
    while position < start + size:
        magic, _, header, length = FATBIN_HEADER.unpack_from(data, position)
        if magic != FATBIN_MAGIC:  # padding between fatbins
            position += 8
            continue
        entry, end = position + header, position + header + length
        while entry < end:
            _, _, entry_header, payload, *_, entry_arch = ENTRY_HEADER.unpack_from(data, entry)
            body = slice(entry + entry_header, entry + entry_header + payload)
            if entry_arch == arch:
                kept += payload
            else:
                data[body] = bytes(payload)
                zeroed += payload
            entry = body.stop
        position = end
    if not kept:
        raise SystemExit(f"the library has no sm_{arch} image")
    library.write_bytes(data)
    return kept, zeroed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="1.31.1")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--part-mib", type=int, default=34)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_PLATFORM, "-d", str(work)]
        subprocess.run([*pip, f"onnxruntime-gpu=={args.version}"], check=True)
        subprocess.run([*pip, "onnxconverter-common"], check=True)
        unpacked = work / "unpacked"
        with zipfile.ZipFile(next(work.glob("onnxruntime_gpu-*.whl"))) as wheel:
            wheel.extractall(unpacked)
        kept, zeroed = keep_arch(unpacked / "onnxruntime" / "capi" / "libonnxruntime_providers_cuda.so", args.arch)
        print(f"fatbin: kept {kept >> 20} MiB of sm_{args.arch} images, zeroed {zeroed >> 20} MiB of others")
        packed = work / "ort.tar.xz"
        with lzma.open(packed, "wb", preset=8) as sink, tarfile.open(fileobj=sink, mode="w") as tar:
            for item in sorted(unpacked.iterdir()):
                tar.add(item, arcname=item.name)
        blob = packed.read_bytes()
        part = args.part_mib << 20
        pieces = [blob[i:i + part] for i in range(0, len(blob), part)]
        if len(pieces) != 2:
            raise SystemExit(f"{len(blob) >> 20} MiB packed makes {len(pieces)} parts; choose --part-mib for two")
        for number, piece in enumerate(pieces, 1):
            folder = ROOT / f".ortgpu{number}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            (folder / f"part.a{'abcdefgh'[number - 1]}").write_bytes(piece)
        for peer in work.glob("onnxconverter_common-*.whl"):
            shutil.copy(peer, ROOT / ".ortgpu1")
    exclude = ROOT / ".git" / "info" / "exclude"
    if exclude.exists() and "/.ortgpu*/" not in exclude.read_text():
        with exclude.open("a") as lines:
            lines.write("/.ortgpu*/\n")
    print(f"packed {len(blob) >> 20} MiB (sha256 {hashlib.sha256(blob).hexdigest()}) into .ortgpu1 and .ortgpu2")


if __name__ == "__main__":
    main()
