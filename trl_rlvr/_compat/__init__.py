"""Private shims that keep TRL, transformers, bitsandbytes and vLLM working as this package needs.

Nothing outside ``trl_rlvr`` imports from here. :mod:`.grpo_adapter` is the one adapter between RLVRTrainer's
public hooks and TRL's private GRPOTrainer internals; :mod:`.trl_contract` lists every private TRL piece it relies on,
by adapter method, and checks it at start-up; :mod:`.quantized` keeps 4-bit weights trainable on AVX512-BF16 CPUs;
:mod:`.vllm_cpu` syncs weights into vLLM's CPU engine (and, as a vLLM worker extension, into a server's);
:mod:`.vllm_server` gives TRL's server-mode client a weight push without NCCL for a trainer on a CPU;
:mod:`.notices` silences TRL's per-call generation notices; :mod:`.logprob_tiles` sizes the token tiles of TRL's
fused LM head for a CPU; :mod:`.gloo_exit` destroys a gloo process group before the interpreter's finalization can
abort a finished rank.
"""
