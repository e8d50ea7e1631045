"""A plain start prints nothing a newcomer would chase: no bitsandbytes kernel notice without a 4-bit model,
no deprecation warning caused by our own config defaults."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

START = """
from trl_rlvr import RLVRConfig, RLVRTrainer
import bitsandbytes  # imported anyway by transformers -> peft where installed; made explicit here
args = RLVRConfig(output_dir={out!r}, bf16=False, use_cpu=True, report_to="none")
assert args.activation_checkpointing is True  # TRL's default, under its new name
"""


def test_import_and_config_are_quiet(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", START.format(out=str(tmp_path))], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr
    noise = [line for line in out.stderr.splitlines() if line.strip()]
    assert not noise, "a plain start printed:\n" + "\n".join(noise)


def test_the_bitsandbytes_filter_drops_only_its_notice():
    import logging

    from trl_rlvr._compat.quantized import silence_cpu_kernel_notice

    silence_cpu_kernel_notice()
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    kept = []
    handler = logging.Handler()
    handler.emit = kept.append
    logger.addHandler(handler)
    try:
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s", "No module named 'kernels'")
        logger.warning("something else about 4-bit weights")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in kept] == ["something else about 4-bit weights"]

    kernels_logger = logging.getLogger("kernels._internals.hf_hub")
    kernels_logger.addHandler(handler)
    try:
        kernels_logger.warning("Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' "
                               "because Hugging Face Hub is in offline mode.")
        kernels_logger.warning("Skipping publisher trust check for 'someone/else' because Hugging Face Hub is offline.")
    finally:
        kernels_logger.removeHandler(handler)
    assert [r.getMessage() for r in kept][1:] == [
        "Skipping publisher trust check for 'someone/else' because Hugging Face Hub is offline."]
