"""tools/nvcc-checked, the build's guard against kernels whose wgmma ptxas serialized: a fake
compiler stands in for nvcc (the guard only reads the compiler's report), so this runs without
CUDA. A report of C7512 or C7514 must fail the unit and remove its object; any other report
(including other ptxas performance notes) must pass it through untouched."""
import subprocess
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "nvcc-checked"


def run(tmp_path, report, rc=0):
    fake = tmp_path / "fake-nvcc"
    fake.write_text(f"""#!/bin/sh
prev=
for a in "$@"; do [ "$prev" = -o ] && echo object > "$a"; prev=$a; done
printf '%s\\n' "{report}" >&2
exit {rc}
""")
    fake.chmod(0o755)
    obj = tmp_path / "unit.o"
    p = subprocess.run([str(TOOL), str(fake), "-c", "-o", str(obj), "unit.cu"], capture_output=True, text=True)
    return p, obj


@pytest.mark.parametrize("code", ["C7512", "C7514"])
def test_serialized_wgmma_fails_and_removes_object(tmp_path, code):
    p, obj = run(tmp_path, f"ptxas info    : ({code}) Potential Performance Loss: wgmma.mma_async instructions are serialized")
    assert p.returncode == 1
    assert not obj.exists()
    assert code in p.stderr and "serialized the wgmma" in p.stderr


def test_clean_report_keeps_object(tmp_path):
    p, obj = run(tmp_path, "ptxas info    : Used 128 registers, 0 bytes spill stores")
    assert p.returncode == 0, p.stderr
    assert obj.read_text() == "object\n"
    assert "Used 128 registers" in p.stderr


def test_compiler_failure_passes_its_status_and_removes_object(tmp_path):
    p, obj = run(tmp_path, "unit.cu(3): error: expected a ;", rc=2)
    assert p.returncode == 2
    assert not obj.exists()
