"""Settings this machine cannot run, found when the config is built (before any model or data loads).

A recipe written for a GPU (``bf16: true``, ``use_vllm: true``) on a CPU otherwise stops inside transformers with
"Your setup doesn't support bf16/gpu", or after the model has loaded. :func:`unusable_settings` lists every such
setting at once and :func:`check_machine` raises one :class:`UnusableSettingsError` that names the overrides, in
the command line's form and in Python's.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


class UnusableSettingsError(ImportError, ValueError):
    """Settings the machine cannot run; ``problems`` lists them, ``overrides`` the fields and values that fix them.

    An ``ImportError`` (vLLM missing) and a ``ValueError`` (a bad setting) at once, so either ``except`` catches it."""

    def __init__(self, problems: list[str], overrides: dict[str, bool]):
        self.problems, self.overrides = list(problems), dict(overrides)
        cli = " ".join(f"--{k} {str(v).lower()}" for k, v in overrides.items())
        python = ", ".join(f"{k}={v}" for k, v in overrides.items())
        super().__init__(f"This machine cannot run these settings: {'; '.join(problems)}. Override them: {cli} "
                         f"(trl-rlvr train / doctor, or the recipe's YAML), {python} in Python.")


@dataclass(frozen=True)
class Machine:
    """What the machine offers: an accelerator with bfloat16 (or XLA), one with float16, vLLM installed."""

    bf16: bool
    fp16: bool
    vllm: bool

    @classmethod
    def here(cls) -> Machine:
        import torch
        from transformers.utils import (
            is_torch_bf16_gpu_available,
            is_torch_xla_available,
        )

        gpu = torch.cuda.is_available() or (getattr(torch, "xpu", None) is not None and torch.xpu.is_available())
        return cls(bf16=bool(is_torch_bf16_gpu_available() or is_torch_xla_available()),
                   fp16=bool(gpu or torch.backends.mps.is_available() or is_torch_xla_available()),
                   vllm=importlib.util.find_spec("vllm") is not None)


def unusable_settings(config, machine: Machine) -> tuple[list[str], dict[str, bool]]:
    """(one message per setting ``machine`` cannot run, the overrides that fix them) for a config (any object with
    ``bf16``, ``fp16``, ``use_cpu``, ``use_vllm``, ``vllm_mode``). ``bf16=None`` is TRL's default, which turns bf16 on
    unless fp16 is. bf16 with ``use_cpu=True`` runs (slowly; :func:`trl_rlvr.checks.settings.check_settings` warns)."""
    problems, overrides = [], {}
    bf16 = (not config.fp16) if config.bf16 is None else bool(config.bf16)
    if bf16 and not config.use_cpu and not machine.bf16:
        default = " (TRL's default)" if config.bf16 is None else ""
        problems.append(f"bf16=True{default} needs a GPU with bfloat16, and this machine has none (or set use_cpu=True "
                        "to keep bfloat16 on the CPU, slower than float32)")
        overrides["bf16"] = False
    if config.fp16 and not config.use_cpu and not machine.fp16:
        problems.append("fp16=True needs a GPU, and this machine has none")
        overrides["fp16"] = False
    if config.use_vllm and not machine.vllm:
        problems.append(f"use_vllm=True (vllm_mode={getattr(config, 'vllm_mode', None)!r}) needs vLLM, which is not "
                        "installed (pip install 'trl-rlvr[vllm]' on a GPU; docs for vLLM's CPU build)")
        overrides["use_vllm"] = False
    return problems, overrides


def check_machine(config, machine: Machine | None = None) -> None:
    """Raise :class:`UnusableSettingsError` naming every setting of ``config`` this machine cannot run."""
    problems, overrides = unusable_settings(config, machine or Machine.here())
    if problems:
        raise UnusableSettingsError(problems, overrides)


def default_cpu_threads(cores: int) -> int:
    """Torch threads for one training process on a CPU: every usable core (``cores``: the process's CPU affinity).

    Fixed, not read from the load: a seeded run must not change its thread count (and so its speed, and possibly its
    reductions) with what else ran in the minute before it started, and the 1-minute load average lags (a quiet
    machine right after an install reads ~1). It pairs with OpenMP threads that spin briefly, then sleep
    (``trl_rlvr.scripts.train.passive_openmp_waits``, before torch loads): an OpenMP thread that waits for one whose
    core another process holds then sleeps instead of spinning on. Measured
    on 2 cores (``python -m benchmarks.cpu_threads --rounds 3``, docs/benchmarks.md): 2 passive threads take
    1.85-1.97x their quiet time when another process spins on one core, about one thread's time (spinning
    threads: 2.3-4.4x), and are 1.7-1.9x faster than one thread when the machine is quiet."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    return cores
