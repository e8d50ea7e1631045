"""The vLLM path of the evaluation without vLLM: a stand-in engine that samples like vLLM does (each request from
a generator seeded with its own seed) checks the plumbing -- one request per sample, seeds from (seed, question,
sample) only, answers cut at the HF path's end-of-sequence tokens and decoded by the evaluation's tokenizer, the
settings handed to vLLM -- and the callback's checks of the trainer's vLLM settings. The real engine on a CPU:
tests/engines/test_vllm_eval.py."""

import random
import sys
import types
from dataclasses import dataclass, field

import pytest

from tests.harness.eval_helpers import RIGHT, first_char

EOS = 2


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list = field(default_factory=list)


def TokensPrompt(prompt_token_ids):  # noqa: N802 - vLLM's name (a TypedDict)
    return {"prompt_token_ids": prompt_token_ids}


class StandInEngine:
    """Samples like vLLM: a request's tokens come from its own generator, seeded with its seed (a seedless request
    from a shared stream); it stops at a stop token (kept in ``token_ids``, finish_reason 'stop') or at max_tokens
    ('length'). Tokens depend on the prompt too, so that mixing prompts up would show."""

    def __init__(self):
        self.calls = []
        self.shared = random.Random(0)

    def generate(self, requests, sampling_params, use_tqdm=True):
        self.calls.append((requests, sampling_params))
        outputs = []
        for request, params in zip(requests, sampling_params, strict=True):
            rng = random.Random(params.seed) if params.seed is not None else self.shared
            ids, reason = [], "length"
            for _ in range(params.max_tokens):
                token = EOS if params.temperature == 0 else rng.randrange(3, 40)
                token = (token + sum(request["prompt_token_ids"])) % 40 if token != EOS else EOS
                ids.append(token)
                if token in params.stop_token_ids:
                    reason = "stop"
                    break
            outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, finish_reason=reason)]))
        return outputs


class StandInTokenizer:
    eos_token_id = EOS

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 37 + 3 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids if not (skip_special_tokens and i == EOS))


@pytest.fixture
def fake_vllm(monkeypatch):
    import trl_rlvr.evaluation.vllm_generation  # noqa: F401 - imports TRL, which probes the real vllm's spec, first
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams,
                                                                  TokensPrompt=TokensPrompt))


def _generate(engine, prompts, qids, **kw):
    from trl_rlvr.evaluation.vllm_generation import generate_completions_vllm

    settings = dict(n=3, eos_ids={EOS, 5}, temperature=0.7, top_p=0.9, top_k=4, max_new_tokens=12, seed=11)
    settings.update(kw)
    return generate_completions_vllm(engine, StandInTokenizer(), prompts, qids, **settings)


PROMPTS = [f"Q{i}: what is {i} + {i}?" for i in range(6)]


def test_each_sample_is_its_own_request_seeded_by_seed_question_and_sample(fake_vllm):
    from trl_rlvr.evaluation.vllm_generation import request_seed

    engine = StandInEngine()
    groups = _generate(engine, PROMPTS, list(range(6)))
    (requests, params), = engine.calls
    assert len(requests) == len(params) == 18 and all(p.n == 1 for p in params)
    assert [p.seed for p in params] == [request_seed(11, q, j) for q in range(6) for j in range(3)]
    assert len({p.seed for p in params}) == 18 and all(0 <= p.seed < 2**63 for p in params)
    assert all((p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.7, 0.9, 4, 12) for p in params)
    assert all(p.stop_token_ids == [EOS, 5] for p in params)
    assert requests[0]["prompt_token_ids"] == StandInTokenizer()(PROMPTS[0])["input_ids"]
    assert [len(g) for g in groups] == [3] * 6


def test_samples_do_not_depend_on_batching_order_or_process_split(fake_vllm):
    together = _generate(StandInEngine(), PROMPTS, list(range(6)))
    one_by_one = [_generate(StandInEngine(), [p], [q])[0] for q, p in enumerate(PROMPTS)]
    two_ranks = {q: g for rank in (0, 1) for q, g in
                 zip(range(rank, 6, 2), _generate(StandInEngine(), PROMPTS[rank::2], list(range(rank, 6, 2))))}
    assert together == one_by_one == [two_ranks[q] for q in range(6)]
    other_seed = _generate(StandInEngine(), PROMPTS, list(range(6)), seed=12)
    assert other_seed != together


def test_answers_are_cut_at_the_end_of_sequence_and_truncation_is_reported(fake_vllm):
    groups = _generate(StandInEngine(), PROMPTS, list(range(6)), n=8, max_new_tokens=6)
    rows = [s for g in groups for s in g]
    finished = [s for s in rows if s[2]]
    truncated = [s for s in rows if not s[2]]
    assert finished and truncated  # both cases occur with these seeds
    assert all(len(ids) == 6 and not set(ids) & {EOS, 5} for _, ids, _ in truncated)
    assert all(len(ids) < 6 and not set(ids) & {EOS, 5} for _, ids, _ in finished)  # the stop token is dropped
    assert all(text == StandInTokenizer().decode(ids) for text, ids, _ in rows)


def test_greedy_requests_have_temperature_zero_and_no_seed(fake_vllm):
    engine = StandInEngine()
    groups = _generate(engine, PROMPTS[:2], [0, 1], n=1, greedy=True)
    assert all(p.temperature == 0.0 and p.seed is None for p in engine.calls[0][1])
    assert groups == [[("", [], True)], [("", [], True)]]
    with pytest.raises(ValueError, match="greedy"):
        _generate(engine, PROMPTS[:2], [0, 1], n=2, greedy=True)
    with pytest.raises(ValueError, match="temperature"):
        _generate(engine, PROMPTS[:2], [0, 1], temperature=0.0)


def test_evaluate_sampled_with_an_engine_scores_its_samples(fake_vllm):
    from trl_rlvr.evaluation.evaluate import evaluate_sampled

    rows = [{"question": f"q{i}", "answer": "", "prompt": PROMPTS[i]} for i in range(6)]
    result = evaluate_sampled(None, StandInTokenizer(), rows, first_char, n=4, max_new_tokens=8, seed=3,
                              llm=StandInEngine(), keep_samples=6)
    assert result["questions"] == 6 and result["n"] == 4
    samples = [q["samples"] for q in result["per_question"]]
    right = sum(s[:1] in RIGHT for group in samples for s in group)  # the toy reward: a vowel first
    assert 0 < right < 24
    assert right == sum(q["right"] for q in result["per_question"]) and result["mean@n"] == pytest.approx(right / 24)


class _Args(types.SimpleNamespace):
    pass


def _trainer(**overrides):
    settings = dict(vllm_mode="colocate", vllm_tensor_parallel_size=1, vllm_enable_sleep_mode=False)
    settings.update(overrides)
    use_vllm = settings.pop("use_vllm", True)
    synced = []
    generation = types.SimpleNamespace(llm="engine", sync_weights=lambda: synced.append(trainer.state.global_step))
    trainer = types.SimpleNamespace(args=_Args(**settings), use_vllm=use_vllm, vllm_generation=generation,
                                    state=types.SimpleNamespace(global_step=0), _last_loaded_step=-1)
    return trainer, synced


@pytest.mark.parametrize("setting, message", [
    ({"use_vllm": False}, "use_vllm=True"),
    ({"vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size=1"),
    ({"vllm_enable_sleep_mode": True}, "vllm_enable_sleep_mode"),
])
def test_the_trainer_engine_is_refused_where_it_cannot_serve_the_evaluation(setting, message):
    from trl_rlvr.evaluation.vllm_generation import check_trainer_vllm

    trainer, _ = _trainer(**setting)
    with pytest.raises(ValueError, match=message):
        check_trainer_vllm(trainer)


def test_in_server_mode_the_evaluation_goes_to_the_trainers_server_after_a_sync():
    from trl_rlvr.evaluation.vllm_generation import check_trainer_vllm, trainer_vllm_engine
    from trl_rlvr.evaluation.vllm_served import ServedEngine

    trainer, synced = _trainer(vllm_mode="server", vllm_tensor_parallel_size=2)  # the server's parallelism is its own
    trainer.vllm_generation.vllm_client = FakeClient()
    check_trainer_vllm(trainer)
    engine = trainer_vllm_engine(trainer)
    assert isinstance(engine, ServedEngine) and engine.client is trainer.vllm_generation.vllm_client
    assert synced == [0]  # the weights pushed to the server first, as TRL pushes them before it generates


class FakeClient:
    """TRL's VLLMClient as ServedEngine uses it: ``get_server_info`` and ``generate`` (a token per request: the
    seed's last digit, then a stop token when the seed is even), every call recorded."""

    base_url = "http://server"

    def __init__(self, device="cpu", max_num_seqs=4, max_num_batched_tokens=64):
        self.calls = []
        # vLLM 0.31's /server_info JSON (the fields read), as TRL's get_server_info returns it
        self.info = {"device_config": {"device": device}, "model_config": {"max_model_len": 128},
                     "scheduler_config": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens}}

    def get_server_info(self):
        return self.info

    def generate(self, prompts, n, max_tokens, generation_kwargs, **sampling):
        self.calls.append({"prompts": prompts, "n": n, "max_tokens": max_tokens, **generation_kwargs, **sampling})
        seed = generation_kwargs.get("seed", 0)
        ids = [seed % 10] + ([generation_kwargs["stop_token_ids"][0]] if seed % 2 == 0 else [])
        return {"completion_ids": [ids[:max_tokens]], "prompt_ids": prompts, "logprobs": None}


def _params(seed, max_tokens=2, n=1):
    return types.SimpleNamespace(n=n, temperature=1.0, top_p=0.9, top_k=-1, min_p=0.0, max_tokens=max_tokens,
                                 seed=seed, stop_token_ids=[99])


def test_a_served_engine_sends_each_sample_with_its_own_seed_and_reads_its_finish():
    from trl_rlvr.evaluation.vllm_generation import cpu_call_limits, engine_max_model_len
    from trl_rlvr.evaluation.vllm_served import ServedEngine

    client = FakeClient()
    engine = ServedEngine(client)
    requests = [{"prompt_token_ids": [i, i + 1]} for i in range(6)]
    outputs = engine.generate(requests, [_params(seed) for seed in (10, 11, 12, 13, 14, 15)])
    assert [o.outputs[0].token_ids for o in outputs] == [[0, 99], [1], [2, 99], [3], [4, 99], [5]]  # in order
    # stopped on a stop token, or short of its budget; 1 token of 1 with no stop token: cut at the budget
    assert [o.outputs[0].finish_reason for o in outputs] == ["stop"] * 6
    (cut,) = engine.generate([{"prompt_token_ids": [1]}], [_params(13, max_tokens=1)])
    assert cut.outputs[0].finish_reason == "length"
    sent = sorted(client.calls[:6], key=lambda c: c["seed"])
    assert [c["seed"] for c in sent] == [10, 11, 12, 13, 14, 15] and all(c["n"] == 1 for c in sent)
    assert sorted(map(tuple, (c["prompts"][0] for c in sent))) == [(i, i + 1) for i in range(6)]
    assert all(c["top_k"] == 0 and c["top_p"] == 0.9 and c["stop_token_ids"] == [99] and c["logprobs"] is None
               for c in sent)
    assert cpu_call_limits(engine) == (4, 60) and engine_max_model_len(engine) == 128
    assert cpu_call_limits(ServedEngine(FakeClient(device="cuda"))) is None
    with pytest.raises(ValueError, match="one sample per request"):
        engine.generate([{"prompt_token_ids": [1]}], [_params(1, n=2)])


def test_a_served_engine_without_the_servers_configuration_warns_and_sends_without_limits():
    from trl_rlvr.evaluation.vllm_generation import cpu_call_limits
    from trl_rlvr.evaluation.vllm_served import ServedEngine

    client = FakeClient()
    client.get_server_info = lambda: (_ for _ in ()).throw(RuntimeError("no development endpoints."))
    with pytest.warns(UserWarning, match="without the CPU wave limits"):
        engine = ServedEngine(client)
    assert cpu_call_limits(engine) is None and engine.max_model_len == float("inf")


def test_the_trainer_engine_is_synced_once_per_step():
    from trl_rlvr.evaluation.vllm_generation import trainer_vllm_engine

    trainer, synced = _trainer()
    assert trainer_vllm_engine(trainer) == "engine" and synced == [0]
    trainer_vllm_engine(trainer)  # same step: TRL's sync already happened, or ours did
    trainer.state.global_step = 3
    trainer_vllm_engine(trainer)
    assert synced == [0, 3] and trainer._last_loaded_step == 3


def test_callback_refuses_an_unknown_generator_and_a_trainer_without_vllm(tiny_model_dir):
    from tests.harness.loss_harness import make_trainer
    from trl_rlvr.evaluation.callback import SampledEvalCallback

    trainer = make_trainer(tiny_model_dir, reward_funcs=[first_char], max_steps=1)
    rows = [{"question": "q", "answer": "c", "prompt": "Q: q A:"}]
    with pytest.raises(ValueError, match="generator must be"):
        SampledEvalCallback(trainer, rows, n=2, eval_steps=1, generator="sglang")
    with pytest.raises(ValueError, match="use_vllm=True"):
        SampledEvalCallback(trainer, rows, n=2, eval_steps=1, generator="vllm")


def test_calls_on_a_cpu_engine_never_need_a_chunked_prefill():
    from trl_rlvr.evaluation.vllm_generation import split_calls

    assert split_calls([5] * 7, None) == [range(7)]
    calls = split_calls([30, 50, 20, 40, 10, 90, 5], (3, 100))
    assert [list(c) for c in calls] == [[0, 1, 2], [3, 4], [5, 6]]
    lengths = [30, 50, 20, 40, 10, 90, 5]
    assert all(len(c) <= 3 and sum(lengths[i] for i in c) <= 100 for c in calls)
    with pytest.raises(ValueError, match="max_num_batched_tokens=100"):
        split_calls([30, 101], (3, 100))


def test_split_calls_keep_the_samples(fake_vllm, monkeypatch):
    from trl_rlvr.evaluation import vllm_generation

    whole = _generate(StandInEngine(), PROMPTS, list(range(6)))
    engine = StandInEngine()
    monkeypatch.setattr(vllm_generation, "cpu_call_limits", lambda llm: (4, 10_000))
    assert _generate(engine, PROMPTS, list(range(6))) == whole
    assert [len(call[0]) for call in engine.calls] == [4, 4, 4, 4, 2]


def test_tool_turns_are_requests_seeded_from_their_own_stream(fake_vllm):
    """The turns of tool rollouts on vLLM (generate_token_rows_vllm): each row a request with its own budget and the
    seed of its turn's stream; the tokens kept up to and including the end-of-sequence token (the tool loop renders
    the reply after it, as TRL does)."""
    from trl_rlvr.evaluation.vllm_generation import generate_token_rows_vllm, stream_seed

    engine = StandInEngine()
    contexts, streams = [[7, 8, 9], [10, 11], [12]], ["0:0:0", "0:0:0:1", "0:1:3:2"]
    rows = generate_token_rows_vllm(engine, contexts, streams, max_new_tokens=[5, 9, 1], eos_ids={EOS, 5},
                                    temperature=0.7, top_p=0.9, top_k=4)
    (requests, params), = engine.calls
    assert [r["prompt_token_ids"] for r in requests] == contexts
    assert [p.seed for p in params] == [stream_seed(s) for s in streams]
    assert len({p.seed for p in params}) == 3 and all(0 <= p.seed < 2**63 for p in params)
    assert [p.max_tokens for p in params] == [5, 9, 1]
    assert {(p.temperature, p.top_p, p.top_k) for p in params} == {(0.7, 0.9, 4)}
    again = generate_token_rows_vllm(StandInEngine(), contexts[::-1], streams[::-1], max_new_tokens=[1, 9, 5],
                                     eos_ids={EOS, 5}, temperature=0.7, top_p=0.9, top_k=4)
    assert again[::-1] == rows  # a row's tokens do not depend on the rows beside it
    for ids, finished in rows:
        cut = [i for i, t in enumerate(ids) if t in (EOS, 5)]
        assert finished == bool(cut) and (not cut or cut[0] == len(ids) - 1)  # kept up to and including the end
    greedy = generate_token_rows_vllm(StandInEngine(), contexts, None, max_new_tokens=[4, 4, 4], eos_ids={EOS})
    assert greedy == [([EOS], True)] * 3
    assert generate_token_rows_vllm(engine, [], None, max_new_tokens=[], eos_ids={EOS}) == []
