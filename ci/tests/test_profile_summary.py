"""python -m ci.profile_summary on a small profile in the format Nsight Compute writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DETAILS = """\
[1] python3@127.0.0.1
  zyfa_kernel (132, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    SM Frequency                    Ghz         1.68
    Duration                         ms         3.10
    Compute (SM) Throughput           %        78.71
"""

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait",'
          '"stall_barrier","stall_no_instruction","stall_math","stall_wait (Not Issued)"')


def _block(kernel: str, rows: str) -> str:
    """One kernel's page of the source view: its name, the column header, its rows."""
    return f'"Kernel Name","{kernel}",\n{HEADER}\n{rows}'


def _summary(tmp_path, details: str, sass: str) -> str:
    """python -m ci.profile_summary's output for a details page and a source view."""
    (tmp_path / "profile.txt").write_text(details)
    (tmp_path / "sass.csv").write_text(sass)
    return subprocess.run([sys.executable, "-m", "ci.profile_summary", str(tmp_path / "profile.txt"),
                           str(tmp_path / "sass.csv")], cwd=ROOT, capture_output=True, text=True, check=True).stdout


SASS = _block("zyfa_kernel", """\
"0x10","      MUFU.EX2 R1, R2","30","1,000","25","0","0","0","25"
"0x20","      FADD R3, R1, R3","10","1,000","5","0","5","0","5"
"0x30","      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9+0x28028], R2","5","8,000","0","5","0","0","0"
"0x40","  @!P0  BRA 0x30","5","8,000","0","5","0","0","0"
""")


def test_summary_reports_metrics_mix_stalls_and_try_waits(tmp_path):
    out = _summary(tmp_path, DETAILS, SASS)
    assert "## zyfa_kernel" in out
    assert "| SM Frequency | 1.68 Ghz |" in out and "| Duration | 3.10 ms |" in out
    assert "| BRA | 8,000 | 44.4% |" in out  # 18,000 instructions executed
    assert "| wait | 60.0% |" in out and "| barrier | 20.0% |" in out  # of 50 samples
    assert "| no_instruction | 10.0% |" in out and "math" not in out  # every reason with samples, and only those
    assert "| MUFU.EX2 | 60.0% |" in out
    assert "- 8,000 (44.4% of the instructions): `SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9+0x28028], R2`" in out


PEER = "void cutlass::device_kernel<Fwd<128, true>>(T1::Params)"  # ncu's demangled name, spaces in it
DETAILS_TWO = DETAILS + f"""\
  {PEER} (132, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us       200.00
  zyfa_kernel (132, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us       900.00
"""
PEER_BLOCK = _block("void cutlass::device_kernel<Fwd<(int)128, (bool)1>>(T1::Params)", """\
"0x10","      HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24","2","500","2","0","0","0","2"
""")
SECOND = _block("zyfa_kernel", """\
"0x10","      MUFU.EX2 R1, R2","3","7,000","3","0","0","0","3"
""")


def test_summary_reports_each_launch_once_in_order(tmp_path):
    # two launches of one kernel (two shapes) and a peer whose source page ncu prints twice, its name spelled
    # differently from the details page
    out = _summary(tmp_path, DETAILS_TWO, SASS + PEER_BLOCK + PEER_BLOCK + SECOND)
    heads = [line for line in out.splitlines() if line.startswith("## ")]
    assert heads == ["## zyfa_kernel", "## void cutlass::device_kernel<Fwd<(int)128, (bool)1>>(T1::Params)",
                     "## zyfa_kernel [2]"]
    peer, second = out.split(heads[1])[1].split(heads[2])
    assert "| Duration | 200.00 us |" in peer and "Executed instructions (warp level): 500." in peer
    assert "| Duration | 900.00 us |" in second and "Executed instructions (warp level): 7,000." in second


LOOP_SASS = _block("zyfa_kernel", """\
"0x10","      HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24","10","100","0","0","10","0","0"
"0x20","      MUFU.EX2 R1, R2","40","9,000","30","0","10","0","30"
"0x30","      FADD R3, R1, R3","20","9,000","20","0","0","0","20"
"0x40","  @P1  BRA 0x20","0","9,000","0","0","0","0","0"
"0x50","      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9+0x28028], R2","30","2,000","0","30","0","0","0"
"0x60","  @!P0  BRA 0x50","0","2,000","0","0","0","0","0"
"0x70","  @P2  BRA 0x10","0","100","0","0","0","0","0"
""")


def test_summary_splits_the_stalls_at_the_hottest_loop(tmp_path):
    # the key loop (0x20-0x40, 27,000 of 31,200 instructions), not the tile loop around it (0x10-0x70, all of them)
    # nor the barrier poll (0x50-0x60, 4,000): the instruction fetch's samples outside it, at the wgmma before the
    # loop, show apart from the loop's
    out = _summary(tmp_path, DETAILS, LOOP_SASS)
    assert "Inside the hottest loop (0x20-0x40)" in out
    assert "| no_instruction | 10.0% | 10.0% |" in out  # of 100 samples: 10 in the loop, 10 before it
    assert "| wait | 50.0% | 0.0% |" in out and "| barrier | 0.0% | 30.0% |" in out
