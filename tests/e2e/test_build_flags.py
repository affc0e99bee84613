"""at::parallel_for's OpenMP pragma lives in an ATen header, so a file that calls it splits its loop over
threads only when that file is compiled with -fopenmp (issue 65: fused_ops.cpp and pil_resize.cpp ran on
one thread, so their "2 threads" tests never ran two). Every source calling it must be compiled so."""
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_parallel_for_is_compiled_with_openmp():
    build = Path(os.environ.get("MMTRAIN_BUILD_DIR", REPO / "build"))
    commands = subprocess.run(["ninja", "-C", str(build), "-t", "commands"], capture_output=True, text=True,
                              check=True).stdout.splitlines()
    callers = [p for p in sorted((REPO / "src").rglob("*.cpp")) if re.search(r"at::parallel_for\(", p.read_text())]
    assert {p.name for p in callers} >= {"fused_ops.cpp", "pil_resize.cpp", "nf4.cpp", "dequantize_rows_cpu.cpp"}
    for path in callers:
        compiles = [c for c in commands if f" -c {path}" in c or c.endswith(f" {path}") or f"{path} " in c]
        compiles = [c for c in compiles if " -o " in c and str(path) in c]
        assert compiles, f"no compile command for {path}"
        assert all("-fopenmp" in c for c in compiles), f"{path.relative_to(REPO)} is compiled without -fopenmp"
