#!/usr/bin/env bash
# One-GPU check of the advertised engines (QLoRA 4-bit, vLLM colocate, ZeRO-2 + dynamic sampling), one table.
#   bash benchmarks/gpu_check.sh --model /path/to/SmolLM2-135M-Instruct [--vllm-python /path/to/vllm-venv/bin/python]
#   bash benchmarks/gpu_check.sh --cpu-smoke [--vllm-python ...]      # CPU dry run on a tiny random model
# Exit status: 0 all ok, 1 a check failed (the table says which and why), 2 a precondition is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" benchmarks/gpu_check.py "$@"
