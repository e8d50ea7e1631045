"""benchmarks/gpu_check.py refuses to start, naming every missing piece, and reports failed checks in its table.

The checks themselves need a GPU; `bash benchmarks/gpu_check.sh --cpu-smoke --vllm-python PY` runs them all on a
CPU with a tiny model (minutes, so not part of the suite).
"""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


def test_refuses_to_start_without_gpu_model_or_vllm(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "--model", str(tmp_path), "--vllm-python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    torch_has_gpu = "import torch; print(torch.cuda.is_available())"
    if subprocess.run([sys.executable, "-c", torch_has_gpu], capture_output=True, text=True).stdout.strip() == "False":
        assert "no CUDA GPU" in proc.stderr
    assert f"--model {tmp_path}: no config.json" in proc.stderr
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert "vllm is not importable" in proc.stderr


def test_a_failed_check_is_marked_with_its_error():
    from benchmarks.gpu_check import table

    results = {"qlora": {"ok": True, "wall_s": 30.0, "step_s": 1.5, "peak_gib": 2.0, "linear4bit": 210,
                         "answers_x_tokens": "16x64"},
               "vllm": {"ok": False, "wall_s": 12.0, "error": "ImportError: libcudart.so.13"},
               "zero2": {"ok": True, "wall_s": 0.0, "skipped": True}}
    text = table(results, smoke=False, model="m")
    assert "step 1.50 s, peak 2.00 GiB" in text
    assert "FAILED" in text and "ImportError: libcudart.so.13" in text and "skipped" in text


@pytest.mark.parametrize("check", ["qlora", "vllm", "zero2"])
def test_each_check_runs_in_its_own_bounded_process(check, tmp_path):
    from benchmarks.gpu_check import TIME_LIMITS, check_command

    cmd, env = check_command(check, "MODEL", smoke=False, vllm_python="/vllm/bin/python", out=tmp_path / "r.json")
    assert TIME_LIMITS[check] <= 300
    assert cmd[cmd.index("--run-check") + 1] == check
    if check == "zero2":
        assert "accelerate.commands.launch" in cmd and cmd[cmd.index("--config_file") + 1].endswith("deepspeed_zero2.yaml")
    if check == "vllm":
        assert cmd[0] == "/vllm/bin/python"


def test_only_the_checks_asked_for_need_their_pieces(tmp_path):
    """`--only qlora zero2` on a machine without vLLM is not refused for vLLM (a GPU lent without it)."""
    from benchmarks.gpu_check import missing_pieces

    nowhere = str(tmp_path / "no-python")
    assert not any("vllm" in m for m in missing_pieces(None, True, nowhere, checks=("qlora", "zero2")))
    assert any("vllm is not importable" in m for m in missing_pieces(None, True, nowhere, checks=("vllm",)))


def test_each_check_keeps_the_callers_pythonpath(monkeypatch, tmp_path):
    """Packages installed with `pip --target DIR` and PYTHONPATH=DIR stay importable inside each check's process."""
    from benchmarks.gpu_check import REPO, check_command

    monkeypatch.setenv("PYTHONPATH", "/opt/site")
    _, env = check_command("qlora", "MODEL", smoke=False, vllm_python="py", out=tmp_path / "r.json")
    assert env["PYTHONPATH"].split(":") == [str(REPO), "/opt/site"]
