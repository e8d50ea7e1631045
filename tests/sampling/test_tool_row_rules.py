"""The multi-turn stabilizers of RLVRConfig through a tiny RLVRTrainer on real tool rollouts (TRL's tool loop, the
sandboxed PythonEnvironment), with scripted policies that make the case each switch is for: void turns
(``void_turn_action``), looping on the tool (``max_tool_calls_per_answer``), cells that raise
(``tool_error_reply``), right answers after broken code (``resample_on_correct``)."""

from __future__ import annotations

import random
import re
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

from tests.harness.loss_harness import assert_grads_equal, reference_loss  # noqa: E402
from tests.rollouts.test_tool_rollouts import MAX_COMPLETION, _logged, make_trainer, right, run_recorded  # noqa: E402
from trl_rlvr.algorithms.multi_turn import tool_call_counts, void_turn_rollouts  # noqa: E402
from trl_rlvr.testing import load_tool_tokenizer, tool_call_text  # noqa: E402

VOID = "let me think about it"


def boxed(text: str) -> bool:
    return "\\boxed{" in text


right.is_final_answer = boxed  # the scripted task's answer reader: a box


def policy(tokenizer, first_turn, later_turn, seed=0):
    """``_generate_single_turn`` of a scripted policy: ``first_turn(question, rng)`` and ``later_turn(results, rng)``
    (the tool's outputs so far) give each turn's text."""
    rng = random.Random(seed)

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            results = re.findall(r"output: (.*?)<eos>", text, flags=re.S)
            question = re.findall(r"<user>(.*?)<eos>", text)[-1]
            reply = later_turn(question, results, rng) if results else first_turn(question, rng)
            out.append(tokenizer(reply + "<eos>", add_special_tokens=False)["input_ids"])
        return out, None

    return generate


def answer_last(question, results, rng):
    return f"\\boxed{{{results[-1].strip()}}}"


def scripted(tiny_model_dir, first_turn, later_turn=answer_last, **overrides):
    trainer = make_trainer(tiny_model_dir, **overrides)
    trainer._generate_single_turn = policy(load_tool_tokenizer(tiny_model_dir), first_turn, later_turn)
    return trainer


def decoded_rows(trainer, rows):
    return [trainer.processing_class.decode(ids) for ids in rows["completion_ids"]]


# ------------------------------------------------------------------------------------------------- void turns
def void_or_call(question, rng):
    return VOID if rng.random() < 0.3 else tool_call_text("python", code=question)


@pytest.mark.parametrize("action,switches", [
    ("zero_advantage", {}),
    ("drop", {}),
    # dynamic sampling's rounds: the driver's re-scaled advantages keep void rows at 0, and its token count (the
    # one TRL's loss divides by with token_count_scope="generation_batch") leaves dropped rows out
    ("drop", {"dynamic_sampling": True, "scale_rewards": "batch", "token_count_scope": "generation_batch"}),
], ids=["zero_advantage", "drop", "drop-dynamic_sampling"])
def test_void_turn_rollouts_leave_the_gradient(tiny_model_dir, action, switches):
    trainer = scripted(tiny_model_dir, void_or_call, void_turn_action=action, learning_rate=0.0, **switches)
    batches, grads, completions = run_recorded(trainer)
    void = void_turn_rollouts(completions, boxed)
    assert 0 < sum(void) < len(void)
    logged = _logged(trainer, "rlvr/void_turn_rollouts")
    assert len(logged) == 2 and all(0 < v < 1 for v in logged)
    if not switches:  # one round per step: the fraction of that round's rollouts
        assert logged == pytest.approx([sum(void[:8]) / 8, sum(void[8:]) / 8])
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)  # lr 0: the same weights
    seen_void = 0
    for rows, got in zip(batches, grads, strict=True):
        is_void = torch.tensor([VOID in text for text in decoded_rows(trainer, rows)])
        seen_void += int(is_void.sum())
        assert (rows["advantages"][is_void] == 0).all()
        if action == "drop":
            assert (rows["completion_mask"][is_void] == 0).all() and (rows["completion_mask"][~is_void].sum(1) > 0).all()
            assert rows["num_items_in_batch"].item() == (rows["completion_mask"] * rows["tool_mask"]).sum().item()
        else:
            assert (rows["completion_mask"][is_void].sum(1) > 0).all()  # in the token count, at advantage 0
        model.zero_grad()
        reference_loss(model, rows, "per_batch_token", num_rows_in_step=rows["prompt_ids"].size(0)).backward()
        assert_grads_equal(got, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
                           atol=1e-6)
    if not switches:  # every rollout generated is trained on
        assert seen_void == sum(void)
    else:
        assert seen_void > 0


def wrote_something(completions, **kwargs):
    """A format-like score every rollout that wrote text earns: a void rollout's only reward."""
    return [0.5 if any(m.get("content") for m in c if m["role"] == "assistant") else 0.0 for c in completions]


@pytest.mark.parametrize("switches", [{}, {"dynamic_sampling": True, "scale_rewards": "batch"}],
                         ids=["one_round", "dynamic_sampling"])  # the driver recomputes the advantages
def test_void_rollouts_scored_as_wrong_are_pushed_down_as_wrong_guesses(tiny_model_dir, switches):
    """``score_as_wrong``: a void rollout loses every term that raises its total (here its 0.5 for writing text) and
    keeps its advantage, computed with the others: below 0 in a group with a right answer, as a wrong guess's."""
    trainer = scripted(tiny_model_dir, void_or_call, void_turn_action="score_as_wrong",
                       reward_funcs=(right, wrote_something), max_steps=1, **switches)
    scored = []
    transform = trainer.transform_rewards

    def recording(rewards_per_func, completions, notes=None):
        out = transform(rewards_per_func.clone(), completions, notes)
        scored.append((void_turn_rollouts(completions, boxed), rewards_per_func.clone(), out.clone()))
        return out

    trainer.transform_rewards = recording  # the public hook between the rewards and the advantages
    batches, _, _ = run_recorded(trainer)
    void, before, after = scored[0]
    void = torch.tensor(void)
    assert 0 < void.sum() < len(void) and (before[void, 1] == 0.5).all()
    assert (after[void] == 0).all() and torch.equal(after[~void], before[~void])
    (rows,) = batches
    is_void = torch.tensor([VOID in text for text in decoded_rows(trainer, rows)])
    prompts = [tuple(p.tolist()) for p in rows["prompt_ids"]]
    pushed_down = 0
    for i in is_void.nonzero().flatten().tolist():  # in a group with a right answer: below 0, not zeroed
        if any(q == prompts[i] and not is_void[j] for j, q in enumerate(prompts)):
            assert rows["advantages"][i] < 0
            pushed_down += 1
    assert pushed_down > 0


def test_void_turns_need_a_reward_that_reads_a_final_answer(tiny_model_dir):
    def plain(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="void_turn_action needs the success reward .'plain'. to say"):
        make_trainer(tiny_model_dir, reward_funcs=(plain,), void_turn_action="drop")


# ------------------------------------------------------------------------------------------- the tool-call cap
def call_again_or_answer(question, results, rng):
    if len(results) == 1 and rng.random() < 0.5:
        return tool_call_text("python", code=question)  # the same cell again: looping on the tool
    return answer_last(question, results, rng)


@pytest.mark.parametrize("overlong", [None, MAX_COMPLETION], ids=["right", "right+overlong"])
def test_rollouts_over_the_tool_call_cap_score_as_wrong(tiny_model_dir, overlong):
    """Over the cap a right answer scores as a wrong one, and keeps its penalties: with DAPO's overlong penalty on
    every token (buffer = the whole budget), an over-cap rollout keeps its negative overlong term (the cap used to
    set it to 0, lifting a long wrong answer's advantage)."""
    trainer = scripted(tiny_model_dir, lambda q, rng: tool_call_text("python", code=q), call_again_or_answer,
                       max_tool_calls_per_answer=1, max_steps=1, overlong_buffer_length=overlong)
    scored = []
    transform = trainer.transform_rewards

    def recording(rewards_per_func, completions, notes=None):
        out = transform(rewards_per_func.clone(), completions, notes)
        scored.append((completions, rewards_per_func.clone(), out.clone()))
        return out

    trainer.transform_rewards = recording  # the public hook between the rewards and the advantages
    trainer.train()
    ((completions, before, rewards),) = scored
    counts = tool_call_counts(completions)
    assert set(counts) == {1, 2}
    for completion, n, reward in zip(completions, counts, rewards[:, 0].tolist(), strict=True):
        assert "\\boxed{" in completion[-1]["content"]  # every rollout answers with the tool's (right) result
        assert reward == (0.0 if n > 1 else 1.0)
    if overlong:
        assert (before[:, 1] < 0).all() and torch.equal(rewards[:, 1], before[:, 1])  # every penalty kept
    weights = trainer.reward_weights
    assert ((rewards * weights).sum(dim=1) <= (before * weights).sum(dim=1)).all()
    assert _logged(trainer, "rlvr/over_tool_call_cap") == [pytest.approx(sum(n > 1 for n in counts) / len(counts))]


# --------------------------------------------------------------------------------------------- error replies
FAKE = 'print("Traceback (most recent call last):\\n  File x\\nValueError: printed, not raised")'


def raise_print_or_compute(question, rng):
    r = rng.random()
    return tool_call_text("python", code="1/0" if r < 0.4 else FAKE if r < 0.7 else question)


@pytest.mark.parametrize("reply", ["full", "last_line"])
def test_a_cell_that_raised_replies_with_its_last_line(tiny_model_dir, reply):
    trainer = scripted(tiny_model_dir, raise_print_or_compute, tool_error_reply=reply, max_steps=1,
                       max_completion_length=600)  # room for whole tracebacks
    _, _, completions = run_recorded(trainer)
    tool = [m["content"] for c in completions for m in c if m["role"] == "tool"]
    raised = [t for t in tool if "ZeroDivisionError" in t]
    printed = [t for t in tool if "printed, not raised" in t]
    assert raised and printed
    assert all("Traceback" in t for t in printed)  # a cell's output is never cut, whatever it looks like
    if reply == "last_line":
        assert all(t.strip() == "ZeroDivisionError: division by zero" for t in raised)
    else:
        assert all("Traceback" in t and "1/0" in t for t in raised)


# ------------------------------------------------------------------------------------------ resample-on-correct
def broken_then_right(question, rng):
    return tool_call_text("python", code="1/0" if rng.random() < 0.5 else question)


def retry_then_answer(question, results, rng):
    if "Error" in results[-1]:
        return tool_call_text("python", code=question)  # the retry after the broken cell
    return answer_last(question, results, rng) if rng.random() < 0.6 else "\\boxed{no}"


def test_resample_on_correct_samples_twice_and_keeps_the_cleanest_right_answers(tiny_model_dir):
    trainer = scripted(tiny_model_dir, broken_then_right, retry_then_answer, resample_on_correct=True,
                       resample_on_correct_oversample=2, max_steps=2, max_completion_length=600)
    batches, _, completions = run_recorded(trainer)
    assert len(completions) == 2 * 2 * 8  # 2 steps, each 2 x its 8 rows sampled
    assert [rows["prompt_ids"].size(0) for rows in batches] == [8, 8]
    sampled, kept = _logged(trainer, "rlvr/sampled_right_tool_errors"), _logged(trainer, "rlvr/resampled_right_tool_errors")
    assert len(sampled) == len(kept) == 2 and all(k <= s for k, s in zip(kept, sampled)) and kept != sampled
    for rows in batches:  # each prompt's G = 4 kept rows (TRL shuffles them), advantages of that group
        prompts = [tuple(p.tolist()) for p in rows["prompt_ids"]]
        assert sorted(prompts.count(p) for p in set(prompts)) == [4, 4]
        for p in set(prompts):
            group = rows["advantages"][[i for i, q in enumerate(prompts) if q == p]]
            assert group.sum().item() == pytest.approx(0.0, abs=1e-5)  # centered on the kept group's mean
