"""QLoRA on every x86 CPU: bitsandbytes' AVX512-BF16 inference layout never reaches a training forward.

bitsandbytes repacks a 4-bit weight for CPU inference on the first eval forward without grad when the
module's ``support_avx512bf16_for_cpu`` is on (it is on exactly on CPUs with AVX512-BF16); the next
training forward then fails. The switch is forced on here, so these tests take that path on any CPU.
"""

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from tests.harness.loss_harness import make_trainer  # noqa: E402
from trl_rlvr._compat.quantized import CPU_PACKING_SWITCH, keep_4bit_weights_trainable  # noqa: E402
from trl_rlvr.scripts.models import quantization_config_4bit  # noqa: E402


def _linear4bit(model):
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def _load_4bit(model_dir, force_cpu_packing: bool | None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, quantization_config=quantization_config_4bit(torch.float32), device_map="cpu"
    )
    layers = _linear4bit(model)
    assert layers, "the tiny model has no 4-bit layers"
    if force_cpu_packing is not None:  # None: as bitsandbytes set it for this CPU
        for module in layers:
            setattr(module, CPU_PACKING_SWITCH, force_cpu_packing)
    return model


def _packed(model) -> list[bool]:
    return [bool(getattr(m.weight.quant_state, "packing_format_for_cpu", False)) for m in _linear4bit(model)]


def _eval_forward(model):
    model.eval()
    with torch.no_grad():
        model(torch.tensor([[7, 8, 9, 10]]))


def _pack_as_an_eval_forward_does(model):
    """The conversion Linear4bit.forward makes on its first eval forward without grad when the switch is on, called
    directly: on a CPU without AVX512-BF16 the forward itself would go on into a kernel that CPU does not have."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    for m in _linear4bit(model):
        assert getattr(m, CPU_PACKING_SWITCH)
        m.weight.data, m.weight.quant_state = _convert_weight_packed_for_cpu(m.weight.data, m.weight.quant_state)


def _has_avx512bf16() -> bool:
    from bitsandbytes.functional import has_avx512bf16

    return bool(has_avx512bf16())


@pytest.mark.skipif(not _has_avx512bf16(), reason="the packed inference kernel needs a CPU with AVX512-BF16")
def test_on_this_cpu_an_eval_forward_packs_without_the_guard(tiny_model_dir):
    """The premise, where users meet it: bitsandbytes turns the switch on by itself and an eval forward packs."""
    model = _load_4bit(tiny_model_dir, force_cpu_packing=None)
    assert all(getattr(m, CPU_PACKING_SWITCH) for m in _linear4bit(model))
    _eval_forward(model)
    assert all(_packed(model))


def test_guard_turns_the_switch_off_and_unpacks(tiny_model_dir):
    model = _load_4bit(tiny_model_dir, force_cpu_packing=True)
    layer = _linear4bit(model)[0]
    original = layer.weight.data.clone()
    _pack_as_an_eval_forward_does(model)
    assert all(_packed(model)) and layer.weight.data.shape != original.shape
    assert keep_4bit_weights_trainable(model) == len(_linear4bit(model))
    assert not any(_packed(model)) and not any(getattr(m, CPU_PACKING_SWITCH) for m in _linear4bit(model))
    assert torch.equal(layer.weight.data, original)  # the 4-bit codes are restored exactly
    _eval_forward(model)
    assert not any(_packed(model))  # and never packed again
    assert keep_4bit_weights_trainable(torch.nn.Linear(2, 2)) == 0


@pytest.mark.slow
@pytest.mark.parametrize("packed_before", [False, True], ids=["fresh", "evaluated-before"])
def test_qlora_trains_through_generation_on_the_avx512bf16_path(tiny_model_dir, packed_before):
    """Generation (eval, no grad) then the loss step, with the AVX512-BF16 switch forced on: fails without
    the trainer's guard (RuntimeError in bitsandbytes' gemv_4bit path), trains with it."""
    from peft import LoraConfig

    model = _load_4bit(tiny_model_dir, force_cpu_packing=True)
    if packed_before:  # e.g. the user evaluated the model before handing it to the trainer
        _pack_as_an_eval_forward_does(model)
        assert all(_packed(model))
    trainer = make_trainer(
        tiny_model_dir,
        reward_funcs=[lambda completions, **_: [float(len(c) % 2) for c in completions]],
        model=model,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        max_steps=2, learning_rate=1e-2, per_device_train_batch_size=8, num_generations=4, temperature=1.0,
    )
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert lora
    trainer.train()
    assert trainer.state.global_step == 2
    assert not any(_packed(trainer.model))
    assert any(not torch.equal(p, lora[n]) for n, p in trainer.model.named_parameters() if n in lora)
