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

Nothing of TRL is replaced: where :func:`reloads_on_cpu` holds (colocate mode, vLLM's engine on a CPU, no sleep
mode), ``GRPOAdapter._generate`` syncs through :func:`sync_weights_on_cpu` before TRL generates, once per optimizer
step, and marks the step synced as TRL marks it (``_last_loaded_step``), so TRL skips its own sync
(``trl_rlvr._compat.grpo_adapter.sync_vllm_weights_once_per_step``, which the evaluation's engine shares).

Server mode uses the same reload on the server's side: :class:`WeightReloadExtension` is a vLLM worker extension
(``--worker-extension-cls``) whose method the trainer calls through the server's ``/collective_rpc`` endpoint with
the path of a safetensors file (trl_rlvr._compat.vllm_server).
"""

from __future__ import annotations

import os
import time


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


def reload_weights(runner, weights) -> None:
    """Load ``weights`` ((name, tensor) pairs in the checkpoint's names) into the model of a vLLM model runner, in
    place, through the runner's reload path; on a CPU, re-pack a tied output layer from its updated weight too.
    The caller resets the prefix cache."""
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    if runner.device.type == "cpu":
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        for layer in tied_output_layers(runner.get_model()):
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)


def sync_weights_on_cpu(generation) -> None:
    """Push the training model's current weights into a CPU vLLM engine through the runner's reload path.

    Every process walks the parameters (`_iter_named_params` gathers ZeRO-3/FSDP shards, a collective), as in TRL.
    """
    reload_weights(model_runner(generation), generation._iter_named_params())
    generation.llm.reset_prefix_cache()


def reloads_on_cpu(generation) -> bool:
    """True when TRL's sync of ``generation`` would fail and :func:`sync_weights_on_cpu` syncs it instead: an
    in-process (colocate) engine on a CPU, without sleep mode (vLLM's CPU backend has none; left to TRL)."""
    return runs_on_cpu(generation) and not getattr(generation, "enable_sleep_mode", False)


class WeightReloadExtension:
    """A vLLM worker extension (``vllm serve ... --worker-extension-cls
    trl_rlvr._compat.vllm_cpu.WeightReloadExtension``): the server side of the weight push without NCCL.

    vLLM mixes this class into its worker class; with ``VLLM_SERVER_DEV_MODE=1`` the server's ``/collective_rpc``
    endpoint calls its methods on every worker, with string arguments only. The trainer writes the weights as one
    safetensors file (in shared memory, on the server's machine) and calls :meth:`trl_rlvr_reload_weights` with its
    path. The names carry a ``trl_rlvr_`` prefix: vLLM refuses an extension whose names its worker already has.
    """

    def trl_rlvr_weight_sync(self, probe: str) -> dict:
        """The handshake before the first push: the first bytes of the trainer's probe file at ``probe`` (the
        trainer checks this worker sees its files), and the worker's device."""
        with open(probe) as file:
            return {"probe": file.read(64), "device": str(self.model_runner.device)}

    def trl_rlvr_reload_weights(self, path: str) -> dict:
        """Load the safetensors file at ``path`` (checkpoint names, as TRL's client streams them) into the served
        model in place (:func:`reload_weights`); returns the tensors loaded and the seconds the reload took."""
        from safetensors import safe_open

        if not (path.endswith(".safetensors") and os.path.isfile(path)):
            raise ValueError(f"trl_rlvr_reload_weights: {path!r} is not a safetensors file on the server's machine")
        start = time.perf_counter()
        with safe_open(path, framework="pt") as weights:
            names = list(weights.keys())
            reload_weights(self.model_runner, ((name, weights.get_tensor(name)) for name in names))
        return {"tensors": len(names), "seconds": time.perf_counter() - start}

    def trl_rlvr_parameter(self, name: str) -> dict:
        """The served model's parameter ``name`` (vLLM's name): its dtype (``"bfloat16"``: vLLM's CPU backend serves a
        float32 checkpoint in bfloat16 unless told ``--dtype float32``) and its values, flattened, as floats; what
        the tests compare with the trainer's. On a CPU only parameters that keep their layout (embeddings, norms)
        can be read: linear weights are repacked."""
        param = dict(self.model_runner.get_model().named_parameters())[name].detach()
        return {"dtype": str(param.dtype).removeprefix("torch."), "values": param.float().flatten().tolist()}
