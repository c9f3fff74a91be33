"""LLVM tools for gfx950 code objects: assemble, and read back symbols, metadata and kernel descriptor."""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from pathlib import Path

CLANG = "clang-22"
READELF = "llvm-readelf-22"
TARGET = ["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx950", "-mcode-object-version=5"]
SIMD_REGISTERS = 512  # unified VGPR + AGPR file per lane per SIMD
VGPR_GRANULE = 8
MAX_WAVES_PER_SIMD = 8
SIMDS_PER_CU = 4
LDS_PER_CU = 163840
KD_GROUP_SEGMENT = 0  # byte offsets inside the 64-byte kernel descriptor
KD_KERNARG_SIZE = 8
KD_RSRC3 = 44
KD_RSRC1 = 48
KD_BYTES = 64


def assemble(text: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = Path(tmp) / "kernel.s", Path(tmp) / "kernel.co"
        src.write_text(text)
        run = subprocess.run([CLANG, "-x", "assembler", *TARGET, str(src), "-o", str(obj)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{CLANG} failed to assemble the kernel:\n{run.stderr}")
        return obj.read_bytes()


def _readelf(path: Path, *flags: str) -> str:
    return subprocess.run([READELF, *flags, str(path)], capture_output=True, text=True, check=True).stdout


def symbols(path: Path) -> dict[str, int]:
    """Defined symbols and their values."""
    found = {}
    for line in _readelf(path, "--syms", "--wide").splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[0][:-1].isdigit() and parts[6] != "UND":
            found[parts[7]] = int(parts[1], 16)
    return found


def metadata(path: Path) -> dict[str, int]:
    """The scalar fields of the first kernel's .amdgpu_metadata note (readelf prints it as YAML)."""
    notes = _readelf(path, "--notes")
    fields = {}
    for key in ("vgpr_count", "agpr_count", "sgpr_count", "group_segment_fixed_size", "kernarg_segment_size",
                "private_segment_fixed_size", "max_flat_workgroup_size"):
        m = re.search(rf"\.{key}:\s+(\d+)", notes)
        if m:
            fields[key] = int(m.group(1))
    return fields


def kernel_descriptor(path: Path, symbol: str) -> dict[str, int]:
    """Fields of the kernel descriptor `symbol`.kd, read from the file's bytes."""
    data = path.read_bytes()
    address = symbols(path)[f"{symbol}.kd"]
    offset = _file_offset(data, address)
    kd = data[offset:offset + KD_BYTES]
    rsrc1, = struct.unpack_from("<I", kd, KD_RSRC1)
    rsrc3, = struct.unpack_from("<I", kd, KD_RSRC3)
    return {
        "group_segment_fixed_size": struct.unpack_from("<I", kd, KD_GROUP_SEGMENT)[0],
        "kernarg_size": struct.unpack_from("<I", kd, KD_KERNARG_SIZE)[0],
        "vgpr_alloc": ((rsrc1 & 0x3F) + 1) * VGPR_GRANULE,  # unified VGPR+AGPR granules of 8
        "accum_offset": ((rsrc3 & 0x3F) + 1) * 4,
    }


def _file_offset(data: bytes, address: int) -> int:
    """File offset of a virtual address, through the ELF64 program headers."""
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        base = phoff + i * phentsize
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, base)
        if p_type == 1 and p_vaddr <= address < p_vaddr + p_filesz:
            return p_offset + address - p_vaddr
    raise ValueError(f"address {address:#x} is in no loadable segment")


def occupancy(vgpr_alloc: int, lds_bytes: int, waves_per_workgroup: int) -> dict[str, int]:
    """Waves per SIMD and workgroups per CU allowed by registers and LDS."""
    by_regs = min(MAX_WAVES_PER_SIMD, SIMD_REGISTERS // vgpr_alloc)
    waves_per_simd_per_wg = -(-waves_per_workgroup // SIMDS_PER_CU)
    wgs = min(by_regs // waves_per_simd_per_wg, LDS_PER_CU // lds_bytes if lds_bytes else by_regs)
    return {"workgroups_per_cu": wgs, "waves_per_simd": wgs * waves_per_simd_per_wg}


def inspect(path: Path) -> dict:
    syms = symbols(path)
    kernels = [s[:-3] for s in syms if s.endswith(".kd")]
    meta = metadata(path)
    kd = kernel_descriptor(path, kernels[0])
    waves = meta["max_flat_workgroup_size"] // 64
    return {
        "symbols": sorted(syms),
        "resources": {
            "vgpr": meta["vgpr_count"], "agpr": meta["agpr_count"], "sgpr": meta["sgpr_count"],
            "vgpr_alloc": kd["vgpr_alloc"], "accum_offset": kd["accum_offset"],
            "lds": kd["group_segment_fixed_size"], "kernarg_size": kd["kernarg_size"],
            "static_shared_bytes": kd["group_segment_fixed_size"],  # LDS is declared in the code object
            **occupancy(kd["vgpr_alloc"], kd["group_segment_fixed_size"], waves),
        },
    }
