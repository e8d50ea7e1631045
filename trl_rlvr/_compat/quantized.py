"""4-bit (bitsandbytes) models that stay trainable on every x86 CPU.

bitsandbytes (0.50 here) has a CPU inference layout for 4-bit weights. On a CPU with AVX512-BF16 (AMD Zen 4,
Intel Sapphire Rapids and later), the first ``Linear4bit`` forward in eval mode without grad (which is what
TRL's generation is) repacks the module's weight in place (``quant_state.packing_format_for_cpu = True``,
gated by the module attribute ``support_avx512bf16_for_cpu``). Every later forward, training included, then
takes the inference-only ``gemv_4bit`` kernel, and the first training step fails with "a view of a leaf
Variable that requires grad is being used in an in-place operation". On CPUs without the instruction set
nothing happens, so the same QLoRA run works on one machine and breaks on the next.

:func:`keep_4bit_weights_trainable` turns the switch off and restores any weight already packed; the
trainer calls it on its models, so every user of ``RLVRTrainer`` gets it. On a GPU the switch is never read.
"""

from __future__ import annotations

import logging
import sys

#: The module attribute bitsandbytes reads before repacking a CPU weight for inference.
CPU_PACKING_SWITCH = "support_avx512bf16_for_cpu"


def keep_4bit_weights_trainable(model) -> int:
    """Keep every bitsandbytes ``Linear4bit`` of ``model`` on the trainable weight layout.

    Sets ``support_avx512bf16_for_cpu = False`` on each module (bitsandbytes then never repacks it) and
    converts back a weight that an earlier eval forward already packed. Returns how many modules had the
    switch on or a packed weight. bitsandbytes is not imported when the model does not use it.
    """
    bnb = sys.modules.get("bitsandbytes")
    if model is None or bnb is None:  # a model with 4-bit layers has imported bitsandbytes already
        return 0
    changed = 0
    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        was_on = bool(getattr(module, CPU_PACKING_SWITCH, False))
        setattr(module, CPU_PACKING_SWITCH, False)
        state = getattr(module.weight, "quant_state", None)
        packed = bool(getattr(state, "packing_format_for_cpu", False))
        if packed:
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

            module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu_inverse(
                module.weight.data, state
            )
        changed += was_on or packed
    return changed


#: What bitsandbytes logs at import on AVX512-BF16 CPUs when the optional ``kernels`` package is absent.
_CPU_KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"


#: What the ``kernels`` package logs when bitsandbytes asks it for that kernel with the Hub offline.
_OFFLINE_TRUST_NOTICE = "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'"


def _not_the_cpu_kernel_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith((_CPU_KERNEL_NOTICE, _OFFLINE_TRUST_NOTICE))


def silence_cpu_kernel_notice() -> None:
    """Drop bitsandbytes' import-time notice about its optional CPU inference kernel.

    transformers imports peft, which imports bitsandbytes whenever it is installed, so every run printed the
    notice, with or without a 4-bit model. The kernel serves only the packed inference layout, which
    :func:`keep_4bit_weights_trainable` keeps out of training: the notice is never actionable here. Only that
    one message is filtered, with the ``kernels`` package's offline notice about that same kernel (printed when
    ``HF_HUB_OFFLINE=1``); bitsandbytes' and kernels' other warnings pass. Must run before bitsandbytes is imported.
    """
    for name in ("bitsandbytes.backends.cpu.ops", "kernels._internals.hf_hub"):
        logger = logging.getLogger(name)
        if _not_the_cpu_kernel_notice not in logger.filters:
            logger.addFilter(_not_the_cpu_kernel_notice)
