"""Run accelerate's own FSDP2 and DeepSpeed paths (what `examples/accelerate/{fsdp,deepspeed_zero*}.yaml` do on
GPUs) on CPU processes over gloo.

accelerate 1.15 decides the distributed type from the accelerator it finds. On a machine without one, for FSDP:
- `use_cpu: true` in an FSDP config is not passed on by the FSDP launcher: every launched process comes up as
  `DistributedType.NO` with `num_processes == 1` (two independent single-process trainings, no gradient
  exchange, no sharding), and the same happens with `use_cpu: false`;
- `ACCELERATE_USE_CPU=1` gives `DistributedType.MULTI_CPU`, and the model is wrapped in plain DDP;
- `--cpu` runs one process.
None of them shards anything. With a DeepSpeed config the processes come up with no backend, so again as
`num_processes == 1`. The single patch below changes only that decision: a launched process that found no
accelerator reports `MULTI_GPU` over gloo, with the device taken from `ACCELERATE_TORCH_DEVICE=cpu`. From there
`AcceleratorState` turns it into `DistributedType.FSDP` or `DEEPSPEED` exactly as it does on GPUs, and everything
after it is the code GPU users run: `fsdp2_prepare_model` (auto-wrap, `fully_shard`, the rank-0 state-dict broadcast
of `cpu_ram_efficient_loading`) or `deepspeed.initialize` (DeepSpeed's CPU accelerator, gloo), transformers'
`is_fsdp_enabled`/ZeRO-3 branches (synced generation), TRL's FSDP/DeepSpeed paths.

    python -m accelerate.commands.launch --config_file CONFIG ... --module tests.harness.engine_launch MODULE ARGS
runs MODULE (e.g. tests.harness.engine_harness) as `__main__` with the patch applied; `launch_on_cpu_with` builds that command.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "accelerate"


def allow_engines_on_cpu() -> None:
    """Make accelerate treat launched CPU processes as a gloo 'multi-GPU' group, so FSDP/DeepSpeed configs apply."""
    import accelerate.state
    from accelerate.utils import DistributedType

    original = accelerate.state.PartialState._prepare_backend

    def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        backend, distributed_type = original(self, cpu, sagemaker_dp, backend)
        if distributed_type == DistributedType.NO and int(os.environ.get("LOCAL_RANK", -1)) != -1:
            return "gloo", DistributedType.MULTI_GPU
        return backend, distributed_type

    accelerate.state.PartialState._prepare_backend = prepare_backend


def launch_on_cpu_with(config: str, module: str, *args, num_processes: int = 2,
                       timeout: float = 900) -> subprocess.CompletedProcess:
    """`accelerate launch` of ``module`` (e.g. "tests.harness.engine_harness") with an example config (e.g. "fsdp.yaml"), fp32,
    on `num_processes` CPU processes, from the repository root."""
    from tests.harness.launch import free_port, run_launch

    env = {**os.environ, "ACCELERATE_TORCH_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ACCELERATE_USE_CPU", None)  # it would turn the run into DDP
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
           "--num_processes", str(num_processes), "--mixed_precision", "no",
           "--main_process_port", str(free_port()), "--module", __spec__.name, module, *map(str, args)]
    return run_launch(cmd, cwd=REPO, env=env, timeout=timeout)


if __name__ == "__main__":
    allow_engines_on_cpu()
    module = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
