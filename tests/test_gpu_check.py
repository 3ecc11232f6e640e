"""benchmarks/gpu_check.py, the GPU check, run on the CPU at toy sizes so it cannot rot."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OUT", None)  # --out names the folder
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return done, out


def test_quick_cpu_run_passes_every_correctness_row(quick_run) -> None:
    done, out = quick_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["complete"] and doc["failed"] == 0 and doc["quick"]
    rows = doc["rows"]
    by_check: dict[str, list[dict]] = {}
    for r in rows:
        by_check.setdefault(r["check"], []).append(r)
    # correctness: every row holds, except fp16 AMP, which needs CUDA
    assert [r["data"]["precision"] for r in by_check["parity"]] == ["fp32", "bf16"] * 2
    for r in by_check["parity"]:
        assert max(r["data"]["engine"], r["data"]["optimized"]) <= r["data"]["tolerance"]
    train = by_check["train"]
    assert [r["status"] for r in train] == ["ok", "skip"] * 3
    assert all(r["data"]["updated"] > 0 for r in train if r["status"] == "ok")
    assert {r["model"].split()[0] for r in train} == {
        "vit_small_patch16_224",
        "swin_tiny_patch4_window7_224",
        "grasp_hybrid_t",
    }
    for check in ("sdpa", "ckpt", "export", "grasp"):
        assert by_check[check] and all(r["status"] == "ok" for r in by_check[check]), check
    for r in by_check["sdpa"]:  # read from the profile: a CPU SDPA kernel or our explicit path
        assert set(r["data"]["ours"]) <= {"cpu-flash", "explicit", "math"}, r
    assert all(r["data"]["grad_max_abs_diff"] == 0.0 for r in by_check["ckpt"])  # bit-identical
    assert by_check["export"][0]["data"]["provider"] == "CPUExecutionProvider"
    assert 1 <= by_check["grasp"][0]["data"]["grasps"] <= 3
    # speed: each case ran once, with its figures
    for check in ("peak", "speed", "latency", "infer"):
        assert by_check[check], check
    assert by_check["speed"][0]["data"]["img_per_s"]["ours"] > 0
    assert "compile" not in by_check  # compiling is the GPU run's
    md = (out / "gpu_check.md").read_text()
    assert "| check | model | status |" in md and md.count("\n| ") == len(rows) + 1
    assert md.splitlines()[-1] in done.stdout  # the printed table is the written one


def test_a_row_that_raises_fails_the_run(tmp_path: Path, monkeypatch, capsys) -> None:
    """A dead path is recorded as a failed row, the rest still run, and the exit status is 1."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import gpu_check

    def broken():
        raise RuntimeError("CUDA error: no kernel image is available\nsecond line")

    def fine():
        return gpu_check.Row("peak", "bf16 matmul", "ok", "1.0 TFLOP/s")

    cases = [("parity", "m", 0, broken), ("peak", "", 0, fine)]
    monkeypatch.setattr(gpu_check, "plan", lambda ctx: cases)
    argv = ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        gpu_check.main()
    assert e.value.code == 1
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["status"] for r in doc["rows"]] == ["FAIL", "ok"] and doc["failed"] == 1
    assert doc["rows"][0]["result"] == "RuntimeError: CUDA error: no kernel image is available"
    assert "1 row(s) failed" in capsys.readouterr().err
