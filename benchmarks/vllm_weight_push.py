"""How long does one weight push to a vLLM server take when the trainer runs on a CPU (no NCCL)?

    /tmp/trl-rlvr-venv-vllm/bin/python -m benchmarks.vllm_weight_push [--model DIR] [--pushes 5] [--save FILE]
    python -m benchmarks.vllm_weight_push --smoke

The path measured is RLVRTrainer's server mode on a CPU (trl_rlvr._compat.vllm_server): TRL's ``VLLMClient``
whose ``update_named_params`` writes the parameters into one safetensors file in shared memory and has the server's
workers reload the model from it in place (vLLM's ``reload_weights``, through ``/collective_rpc``). It starts the
server as a user does (``python -m trl_rlvr.scripts.vllm_serve --model DIR``), loads the same model in transformers
(float32, as the trainer holds it), and pushes ``--pushes`` times, each after a change of every weight (as after
an optimizer step), with the names, dtypes and shapes TRL sends. Per push: the bytes, the seconds to write the
file, the seconds until the server answered the reload (and the reload's own seconds, as the server measured
them). Checked after the last push: the served ``model.norm.weight`` equals the trainer's (in the served dtype:
vLLM's CPU backend serves a float32 checkpoint in bfloat16), and the served
model's log-probs of a text agree with transformers' (so the repacked linear layers took the new weights too).

Goal (the server-mode issue): <= 2 s per push for SmolLM2-135M-Instruct on a CPU. vLLM is needed (its CPU build
lives in its own venv, ``.ci/run``); without it the benchmark exits 77 and says so. ``--smoke``: a tiny random
model (trl_rlvr.testing.build_tiny_model), 2 pushes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks._status import finish, skip

NAME = "vllm_weight_push"
DEFAULT_MODEL = os.path.expanduser("~/.cache/trl_rlvr/SmolLM2-135M-Instruct")
GOAL_S = 2.0
PROBE_TEXT = "The answer to 12 + 30 is 42, because 12 + 30 = 42."
AGREE = 0.1  # nats/token between vLLM's CPU kernels and transformers on the same weights
NORM = "model.norm.weight"


def tiny_model() -> str:
    from trl_rlvr.testing import build_tiny_model

    return str(build_tiny_model(tempfile.mkdtemp(prefix="tiny_push_"), hidden_size=256))  # vLLM's CPU attention: heads >= 32


def served_logprobs(client, ids: list[int]) -> list[float]:
    """The server's log-probs of ``ids[1:]`` (TRL's client: the prompt's own log-probs)."""
    out = client.get_sequence_logprobs([ids], [1], top_logprobs=1)
    return [position[0] for position in out["actual_logprobs"][0]]


def model_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def push_times(model, client, pushes: int) -> list[dict]:
    """``pushes`` pushes of every parameter, each after a change of every weight; the client's timings of each."""
    import torch

    metadata = [(n, str(p.dtype).removeprefix("torch."), list(p.shape)) for n, p in model.named_parameters()]
    times = []
    for push in range(pushes):
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1.0 + 1e-3 * (push + 1))  # every weight moves, as after an optimizer step
        start = time.perf_counter()
        client.update_named_params(metadata, ((n, p.data) for n, p in model.named_parameters()))
        client.reset_prefix_cache()  # as TRL's sync_weights does after the push
        times.append({**client.last_push, "total_s": time.perf_counter() - start})
    return times


def run(model_dir: str, pushes: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_rlvr._compat.vllm_server import FileWeightSyncClient, served_parameter_matches
    from trl_rlvr.scripts.local_server import served

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(model_dir)(PROBE_TEXT)["input_ids"]
    with served(model_dir) as server:
        client = FileWeightSyncClient(base_url=server.base_url)
        client.init_communicator(device="cpu")
        times = push_times(model, client, pushes)
        norm_equal = served_parameter_matches(server.base_url, NORM, dict(model.named_parameters())[NORM])
        gap = max(abs(a - b) for a, b in zip(served_logprobs(client, ids), model_logprobs(model, ids), strict=True))
        return {"model": model_dir, "startup_s": server.startup_s, "command": server.command, "pushes": times,
                "norm_equal": norm_equal, "logprob_gap": gap, "weights_dir": client.file_dir}


def report(result: dict, smoke: bool) -> list[str]:
    pushes = result["pushes"]
    print(f"server: {' '.join(result['command'][1:])}\n  up in {result['startup_s']:.1f} s; weights file in "
          f"{os.path.dirname(result['weights_dir'])}")
    print(f"{'push':>4s} {'MB':>7s} {'write s':>8s} {'reload s':>9s} {'server reload s':>16s} {'total s':>8s}")
    for i, t in enumerate(pushes):
        print(f"{i:4d} {t['bytes'] / 1e6:7.1f} {t['write_s']:8.2f} {t['reload_s']:9.2f} {t['server_reload_s']:16.2f} "
              f"{t['total_s']:8.2f}")
    median = statistics.median(t["total_s"] for t in pushes)
    goal = "met" if median <= GOAL_S else "NOT met"
    print(f"median push {median:.2f} s (goal <= {GOAL_S:.0f} s for SmolLM2-135M: {goal}{', smoke model' if smoke else ''});"
          f" served {NORM} equals the trainer's: {result['norm_equal']}; log-prob gap after the pushes "
          f"{result['logprob_gap']:.4f} nats/token; load average {os.getloadavg()[0]:.2f}")
    failures = [] if result["norm_equal"] else [f"the served {NORM} differs from the trainer's after the pushes"]
    if result["logprob_gap"] >= AGREE:
        failures.append(f"the served log-probs differ from the trainer's by {result['logprob_gap']:.3f} nats/token")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help=f"model folder (default: {DEFAULT_MODEL})")
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--save", default=None, help="write the result as JSON")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 2 pushes")
    args = parser.parse_args(argv)
    print("$ " + " ".join([os.path.basename(sys.executable), "-m", f"benchmarks.{NAME}", *(sys.argv[1:] if argv is None else argv)]),
          flush=True)
    if importlib.util.find_spec("vllm") is None:
        return skip(NAME, "vLLM is not installed here: run it with the vLLM venv, "
                          "/tmp/trl-rlvr-venv-vllm/bin/python -m benchmarks.vllm_weight_push (.ci/run builds it)")
    model_dir = tiny_model() if args.smoke else (args.model or DEFAULT_MODEL)
    result = run(model_dir, 2 if args.smoke else args.pushes)
    failures = report(result, args.smoke)
    if args.save:
        with open(args.save, "w") as file:
            json.dump(result, file, indent=1)
    return finish(NAME, failures)


if __name__ == "__main__":
    sys.exit(main())
