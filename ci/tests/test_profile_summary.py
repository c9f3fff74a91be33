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
          '"stall_barrier","stall_wait (Not Issued)"')
SASS = f"""\
"Kernel Name","zyfa_kernel",
{HEADER}
"0x10","      MUFU.EX2 R1, R2","30","1,000","25","0","25"
"0x20","      FADD R3, R1, R3","10","1,000","5","0","5"
"0x30","      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9+0x28028], R2","5","8,000","0","5","0"
"0x40","  @!P0  BRA 0x30","5","8,000","0","5","0"
"""


def test_summary_reports_metrics_mix_stalls_and_try_waits(tmp_path):
    (tmp_path / "profile.txt").write_text(DETAILS)
    (tmp_path / "sass.csv").write_text(SASS)
    out = subprocess.run([sys.executable, "-m", "ci.profile_summary", str(tmp_path / "profile.txt"),
                          str(tmp_path / "sass.csv")], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "## zyfa_kernel" in out
    assert "| SM Frequency | 1.68 Ghz |" in out and "| Duration | 3.10 ms |" in out
    assert "| BRA | 8,000 | 44.4% |" in out  # 18,000 instructions executed
    assert "| wait | 60.0% |" in out and "| barrier | 20.0% |" in out  # of 50 samples
    assert "| MUFU.EX2 | 60.0% |" in out
    assert "- 8,000 (44.4% of the instructions): `SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9+0x28028], R2`" in out
