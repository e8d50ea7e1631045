"""TRL's vLLM weight sync (colocate mode) made to work when vLLM runs on a CPU.

vLLM's CPU backend repacks every linear layer's weight for its GEMM kernels once loading is done
(`dispatch_cpu_unquantized_gemm`, from `process_weights_after_loading`) and leaves an empty placeholder parameter
where the weight was. TRL 1.16's colocate `VLLMGeneration.sync_weights` calls the model's `load_weights` on the
live model, whose weight loaders then meet the placeholders and fail at the first training step
(`'Parameter' object has no attribute 'weight_loader'`); no vLLM setting turns the repacking off.

What works is the path vLLM itself uses to reload a model in place: the model runner's
`reload_weights(weights_iterator=..., is_checkpoint_format=True)` restores each layer's checkpoint layout, loads the
given tensors into it and runs `process_weights_after_loading` again (so the kernels are repacked from the new
weights). Two things it leaves to the caller:
- an output layer tied to the input embedding (`tie_word_embeddings`, e.g. SmolLM2, Qwen2.5-0.5B) receives no
  tensor of its own, so its packed copy is not rebuilt; it is re-dispatched here from the shared, updated weight;
- the prefix cache holds keys/values computed with the old weights, so it is reset, as TRL does.

`adapt_weight_sync(generation)` replaces the `sync_weights` of one TRL `VLLMGeneration` object (no global patch;
a plain GRPOTrainer is untouched), and only in colocate mode with vLLM's engine on a CPU.
"""

from __future__ import annotations

import types

_ADAPTED = "_trl_rlvr_cpu_weight_sync"


def model_runner(generation):
    """The vLLM model runner that lives in this process (colocate mode, external launcher)."""
    return generation.llm.llm_engine.model_executor.driver_worker.model_runner


def runs_on_cpu(generation) -> bool:
    """True when `generation` drives an in-process (colocate) vLLM engine whose model runner is on a CPU."""
    if getattr(generation, "mode", None) != "colocate" or getattr(generation, "llm", None) is None:
        return False
    return model_runner(generation).device.type == "cpu"


def tied_output_layers(model) -> list:
    """Modules with a CPU GEMM kernel (`cpu_linear`) whose weight is shared with another module (tied embeddings)."""
    owners: dict[int, int] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if weight is not None and weight.numel() > 0:
            owners[weight.data_ptr()] = owners.get(weight.data_ptr(), 0) + 1
    return [module for module in model.modules()
            if hasattr(module, "cpu_linear") and getattr(module, "weight", None) is not None
            and module.weight.numel() > 0 and owners.get(module.weight.data_ptr(), 0) > 1]


def sync_weights_on_cpu(generation) -> None:
    """Push the training model's current weights into a CPU vLLM engine through the runner's reload path.

    Every process walks the parameters (`_iter_named_params` gathers ZeRO-3/FSDP shards, a collective), as in TRL.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    runner = model_runner(generation)
    runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
    for layer in tied_output_layers(runner.get_model()):
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    generation.llm.reset_prefix_cache()


def adapt_weight_sync(generation) -> bool:
    """Route `generation.sync_weights` through `sync_weights_on_cpu` when vLLM runs on a CPU; True if adapted.

    Idempotent. Sleep mode is left to TRL (vLLM's CPU backend has no sleep mode).
    """
    if getattr(generation, _ADAPTED, False):
        return True
    if not runs_on_cpu(generation) or getattr(generation, "enable_sleep_mode", False):
        return False
    generation.sync_weights = types.MethodType(sync_weights_on_cpu, generation)
    setattr(generation, _ADAPTED, True)
    return True
