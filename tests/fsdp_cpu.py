"""Run accelerate's own FSDP2 path (the one `examples/accelerate/fsdp.yaml` takes on GPUs) on CPU processes.

accelerate 1.15 decides the distributed type from the accelerator it finds. On a machine without one:
- `use_cpu: true` in an FSDP config is not passed on by the FSDP launcher: every launched process comes up as
  `DistributedType.NO` with `num_processes == 1` (two independent single-process trainings, no gradient
  exchange, no sharding), and the same happens with `use_cpu: false`;
- `ACCELERATE_USE_CPU=1` gives `DistributedType.MULTI_CPU`, and the model is wrapped in plain DDP;
- `--cpu` runs one process.
None of them shards anything. The single patch below changes only that decision: a launched process that found no
accelerator reports `MULTI_GPU` over gloo, with the device taken from `ACCELERATE_TORCH_DEVICE=cpu`. From there
`AcceleratorState` turns it into `DistributedType.FSDP` exactly as it does on GPUs, and everything after it is the
code GPU users run: `fsdp2_prepare_model` (auto-wrap, `fully_shard`, the rank-0 state-dict broadcast of
`cpu_ram_efficient_loading`), transformers' `is_fsdp_enabled` branches (synced generation), TRL's FSDP paths.

    python -m accelerate.commands.launch --config_file examples/accelerate/fsdp.yaml ... tests/fsdp_cpu.py SCRIPT ARGS
runs SCRIPT as `__main__` with the patch applied; `launch_fsdp_on_cpu` builds that command.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FSDP_CONFIG = REPO / "examples" / "accelerate" / "fsdp.yaml"


def allow_fsdp_on_cpu() -> None:
    """Make accelerate treat launched CPU processes as a gloo 'multi-GPU' group, so an FSDP config applies."""
    import accelerate.state
    from accelerate.utils import DistributedType

    original = accelerate.state.PartialState._prepare_backend

    def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        backend, distributed_type = original(self, cpu, sagemaker_dp, backend)
        if distributed_type == DistributedType.NO and int(os.environ.get("LOCAL_RANK", -1)) != -1:
            return "gloo", DistributedType.MULTI_GPU
        return backend, distributed_type

    accelerate.state.PartialState._prepare_backend = prepare_backend


def launch_fsdp_on_cpu(*script_and_args, num_processes: int = 2, timeout: float = 900) -> subprocess.CompletedProcess:
    """`accelerate launch` with the example FSDP2 config, fp32, on `num_processes` CPU processes (gloo)."""
    from launch import free_port

    env = {**os.environ, "ACCELERATE_TORCH_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ACCELERATE_USE_CPU", None)  # it would turn the run into DDP
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
           "--num_processes", str(num_processes), "--mixed_precision", "no",
           "--main_process_port", str(free_port()), __file__, *map(str, script_and_args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


if __name__ == "__main__":
    allow_fsdp_on_cpu()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")
