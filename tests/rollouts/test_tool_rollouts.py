"""RLVRTrainer on multi-turn tool rollouts: TRL's tool loop with the sandboxed ``PythonEnvironment``, on CPU.

The policy is scripted (the tiny random model writes no tool calls): its first turn calls the Python tool on the
question (or, now and then, answers without it), its turn after the tool's result answers ``\\boxed{...}`` with
that result or a wrong one. Everything else is the real thing: TRL's tool loop, the sandbox, tool masks, the
RLVR switches, the loss and its gradient.
"""

from __future__ import annotations

import math
import random
import re
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

from reward_plugins.code_sandbox import PythonEnvironment  # noqa: E402
from tests.harness.launch import launch_on_cpu  # noqa: E402
from tests.harness.loss_harness import assert_grads_equal, reference_loss, strip_ddp_prefix  # noqa: E402
from trl_rlvr.testing import load_tool_tokenizer, tool_call_text  # noqa: E402

MAX_COMPLETION = 192


def questions(n=32, seed=0):
    rng = random.Random(seed)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(n)]
    return [f"{a}*{b}" for a, b in pairs], [str(a * b) for a, b in pairs]


def right(completions, answer, **kwargs):
    """1 when the last turn boxes the gold answer."""
    pairs = zip(completions, answer, strict=True)
    return [float(f"\\boxed{{{gold}}}" in turns[-1]["content"]) for turns, gold in pairs]


right.verifies_correctness = True


class CheckedPython(PythonEnvironment):
    """The Python tool, recording every reset (a refill round must reset before it reuses an instance)."""

    resets = 0

    def reset(self, **row):
        type(self).resets += 1
        return super().reset(**row)


def scripted_policy(tokenizer, seed=0):
    """``_generate_single_turn`` of a policy that uses the tool: one completion per prompt."""
    rng = random.Random(seed)

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            results = re.findall(r"output: (.*?)<eos>", text, flags=re.S)
            if not results:  # first turn: the question is the last user turn
                question = re.findall(r"<user>(.*?)<eos>", text)[-1]
                # a cell that fails if anything of an earlier rollout were left in this interpreter
                code = f"assert 'seen' not in dir()\nseen = 1\n{question}"
                reply = "\\boxed{0}" if rng.random() < 0.2 else tool_call_text("python", code=code)
            else:
                reply = f"\\boxed{{{results[-1].strip() if rng.random() < 0.6 else 'no'}}}"
            out.append(tokenizer(reply + "<eos>", add_special_tokens=False)["input_ids"])
        return out, None

    return generate


def make_trainer(model_dir, dataset=None, environment_factory=CheckedPython, reward_funcs=(right,), **overrides):
    import tempfile

    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_rlvr import RLVRConfig, RLVRTrainer

    settings = dict(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=4,
        max_completion_length=MAX_COMPLETION, learning_rate=0.0, max_grad_norm=0.0, max_steps=2, bf16=False,
        activation_checkpointing=False, report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        seed=0, loss_normalization="per_batch_token", beta=0.0,
    )  # fmt: skip
    settings.update(overrides)
    if dataset is None:
        prompts, answers = questions()
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts], "answer": answers})
    tokenizer = load_tool_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = RLVRTrainer(
        model=model, reward_funcs=list(reward_funcs), args=RLVRConfig(**settings), train_dataset=dataset,
        processing_class=tokenizer, environment_factory=environment_factory,
    )  # fmt: skip
    trainer._generate_single_turn = scripted_policy(tokenizer)
    return trainer


def run_recorded(trainer):
    """Train; -> (micro-batches that reached the loss, gradient at each optimizer step, completions scored)."""
    from transformers import TrainerCallback

    batches, grads, completions = [], [], []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *args, **kwargs):
        batches.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(model, inputs, *args, **kwargs)

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            params = trainer.model.named_parameters()
            grads.append({n: p.grad.detach().clone() for n, p in params if p.grad is not None})

    calculate = trainer._calculate_rewards

    def recording_rewards(inputs, prompts, comps, ids):
        completions.extend(comps)
        return calculate(inputs, prompts, comps, ids)

    trainer.compute_loss = recording
    trainer._calculate_rewards = recording_rewards
    trainer.add_callback(Grads())
    trainer.train()
    return batches, grads, completions


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.parametrize("switch", ["dynamic_sampling", "selective_sampling"])
def test_training_steps_on_tool_rollouts_match_the_reference_with_tool_tokens_masked(tiny_model_dir, switch):
    from transformers import AutoModelForCausalLM

    CheckedPython.resets = 0
    trainer = make_trainer(tiny_model_dir, **{switch: True})
    batches, grads, completions = run_recorded(trainer)
    assert len(batches) == len(grads) == 2
    tool_turns = [m for c in completions for m in c if m["role"] == "tool"]
    assert tool_turns and all("Traceback" not in m["content"] for m in tool_turns)  # every rollout: a fresh interpreter
    assert CheckedPython.resets == len(completions)  # refill rounds too: one reset per rollout
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)  # lr 0: the same weights
    for rows, got in zip(batches, grads, strict=True):
        assert "tool_mask" in rows and (rows["tool_mask"] * rows["completion_mask"] == 0).any()  # tool tokens inside
        if switch == "dynamic_sampling":  # every kept group has signal
            assert (rows["advantages"].view(-1, 4).abs().sum(dim=1) > 0).all()
        model.zero_grad()
        reference_loss(model, rows, "per_batch_token", num_rows_in_step=rows["prompt_ids"].size(0)).backward()
        want = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        assert_grads_equal(got, want, atol=1e-6)
        # the check can tell: with the tool's tokens in the loss, the gradient is another one
        model.zero_grad()
        unmasked = {k: v for k, v in rows.items() if k != "tool_mask"}
        reference_loss(model, unmasked, "per_batch_token", num_rows_in_step=rows["prompt_ids"].size(0)).backward()
        name = next(iter(want))
        assert not torch.allclose(strip_ddp_prefix(got)[name], model.get_parameter(name).grad, atol=1e-6)
    assert _logged(trainer, "rlvr/tool_calls_per_rollout")
    assert _logged(trainer, "rlvr/tool_errors_per_rollout") == [0.0, 0.0]


def test_lengths_count_model_written_tokens_and_tool_metrics(tiny_model_dir):
    """rlvr/length_right and rlvr/length_wrong average the tokens the MODEL wrote: weighted by the accuracy they
    give back TRL's completions/mean_length, which leaves the tools' results out."""
    trainer = make_trainer(tiny_model_dir, max_steps=1)
    _, _, completions = run_recorded(trainer)
    log = next(h for h in trainer.state.log_history if "rlvr/accuracy" in h)
    p = log["rlvr/accuracy"]
    assert 0 < p < 1
    mixed = p * log["rlvr/length_right"] + (1 - p) * log["rlvr/length_wrong"]
    assert mixed == pytest.approx(log["completions/mean_length"], rel=1e-5)
    calls = sum(1 for c in completions for m in c if m["role"] == "tool") / len(completions)
    assert log["rlvr/tool_calls_per_rollout"] == pytest.approx(calls)
    assert log["rlvr/tool_timeouts_per_rollout"] == 0.0 and log["rlvr/tool_restarts_per_rollout"] == 0.0


def test_overlong_penalty_counts_model_written_tokens(tiny_model_dir):
    """With overlong_buffer_length, the penalty is measured on the tokens the model wrote."""
    seen = []

    def spy(completions, completion_ids, tool_mask=None, **kwargs):
        seen.append((completion_ids, tool_mask))
        return [0.0] * len(completions)

    trainer = make_trainer(tiny_model_dir, reward_funcs=(right, spy), max_steps=1, overlong_buffer_length=100,
                           max_completion_length=MAX_COMPLETION)  # fmt: skip
    run_recorded(trainer)
    ids, masks = seen[0]
    assert masks is not None and any(0 in m for m in masks)
    model_lengths = [sum(m) for m in masks]
    from trl_rlvr.algorithms.shaping import validate_overlong  # noqa: F401 - the same formula as the plugin's own test

    def dapo(n, l_max=MAX_COMPLETION, cache=100):
        return 0.0 if n <= l_max - cache else max(-1.0, (l_max - cache - n) / cache)

    want = sum(dapo(n) for n in model_lengths) / len(model_lengths)
    got = next(h for h in trainer.state.log_history if "rewards/overlong/mean" in h)["rewards/overlong/mean"]
    assert got == pytest.approx(want, abs=1e-6)
    assert got != pytest.approx(sum(dapo(len(i)) for i in ids) / len(ids), abs=1e-6)  # all tokens: another value


# ------------------------------------------------------------------------------------------------ datasets
class TaskFromRow(PythonEnvironment):
    """An environment whose reset() gives the prompt (rows carry no ``prompt``)."""

    def reset(self, task=None, **row):
        super().reset()
        return task


def test_dataset_without_prompt_is_accepted_with_an_environment(tiny_model_dir):
    from datasets import Dataset

    prompts, answers = questions(8)
    data = Dataset.from_dict({"task": prompts, "answer": answers})
    trainer = make_trainer(tiny_model_dir, dataset=data, environment_factory=TaskFromRow, max_steps=1)
    _, _, completions = run_recorded(trainer)
    assert completions


def test_dict_of_environments_rows_carry_only_environment(tiny_model_dir):
    from datasets import Dataset

    def always(completions, **kwargs):
        return [1.0] * len(completions)

    data = Dataset.from_dict({"environment": ["py"] * 8})
    make_trainer(tiny_model_dir, dataset=data, environment_factory={"py": PythonEnvironment}, reward_funcs=(always,))
    with pytest.raises(ValueError, match="the column 'environment'"):
        make_trainer(tiny_model_dir, dataset=Dataset.from_dict({"task": ["x"] * 8}),
                     environment_factory={"py": PythonEnvironment}, reward_funcs=(always,))  # fmt: skip
    with pytest.raises(ValueError, match="the column 'prompt'"):
        make_trainer(tiny_model_dir, dataset=Dataset.from_dict({"task": ["x"] * 8}), environment_factory=None,
                     reward_funcs=(always,))  # fmt: skip


def test_selective_sampling_without_a_dataset_names_both_options(tiny_model_dir):
    from trl_rlvr import RLVRConfig, RLVRTrainer

    args = RLVRConfig(output_dir="/tmp/unused", selective_sampling=True, max_steps=1, report_to="none", bf16=False,
                      num_generations=4, per_device_train_batch_size=8)  # fmt: skip
    with pytest.raises(ValueError, match=r"selective_sampling=True.*environment_factory"):
        RLVRTrainer(model=str(tiny_model_dir), reward_funcs=[right], args=args, environment_factory=PythonEnvironment)


def test_tool_metrics_are_means_over_rollouts_with_stats():
    from trl_rlvr.algorithms.metrics import tool_metrics

    rows = torch.tensor([[1, 2, 1, 0, 0], [1, 0, 0, 1, 1], [0, 3, 0, 0, 0], [0, 1, 0, 0, 0]], dtype=torch.float32)
    assert tool_metrics(rows) == {
        "rlvr/tool_calls_per_rollout": 1.5, "rlvr/tool_errors_per_rollout": 0.5,
        "rlvr/tool_timeouts_per_rollout": 0.5, "rlvr/tool_restarts_per_rollout": 0.5,
    }  # fmt: skip
    assert tool_metrics(rows[2:]) == {"rlvr/tool_calls_per_rollout": 2.0}
    assert not math.isnan(tool_metrics(rows[:1])["rlvr/tool_errors_per_rollout"])


def test_the_tool_recipe_builds_its_environment_factory():
    from pathlib import Path

    from trl_rlvr.scripts.train import build_environment_factory, make_parser

    recipe_file = Path(__file__).resolve().parents[2] / "examples" / "recipes" / "tool_math.yaml"
    recipe, args, _ = make_parser().parse_args_and_config(["--config", str(recipe_file), "--use_cpu", "true",
                                                           "--use_vllm", "false"])  # fmt: skip
    factory = build_environment_factory(recipe)
    assert factory.func is PythonEnvironment and factory.keywords == recipe.environment_options
    env = factory()
    assert env.limits.timeout == 5.0 and env.limits.rollout_timeout == 30.0
    assert args.max_tool_calling_iterations == 4
    recipe.environment_factory = "reward_plugins.code_sandbox.NoSuchEnvironment"
    with pytest.raises(ValueError, match="environment_factory 'reward_plugins.code_sandbox.NoSuchEnvironment'"):
        build_environment_factory(recipe)


@pytest.mark.slow
def test_two_processes_on_tool_rollouts_match_the_reference(tiny_model_dir, tmp_path):
    """Dynamic sampling on 2 processes (groups may span them): each rank's loss saw its own rows; the all-reduced
    gradient is the reference over both ranks' rows, tool tokens masked, divided by the global token count."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "tools"
    launch_on_cpu("--module", "tests.rollouts.test_tool_rollouts", tiny_model_dir, out)
    ranks = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
    assert all(r["num_processes"] == 2 for r in ranks)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for step in range(2):
        rows = [r["batches"][step] for r in ranks]
        tokens = sum(float((b["completion_mask"] * b["tool_mask"]).sum()) for b in rows)
        model.zero_grad()
        loss = sum(reference_loss(model, b, "per_batch_token", b["prompt_ids"].size(0))
                   * float((b["completion_mask"] * b["tool_mask"]).sum()) / tokens for b in rows)  # fmt: skip
        loss.backward()
        want = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        for r in ranks:
            assert_grads_equal(r["grads"][step], want, atol=1e-6)


if __name__ == "__main__":  # one rank of the 2-process test: python -m tests.rollouts.test_tool_rollouts MODEL_DIR OUT
    model_dir, out = sys.argv[1], sys.argv[2]
    trainer = make_trainer(model_dir, dynamic_sampling=True, per_device_train_batch_size=4)
    batches, grads, _ = run_recorded(trainer)
    rank = trainer.accelerator.process_index
    torch.save({"num_processes": trainer.accelerator.num_processes, "batches": batches, "grads": grads},
               f"{out}.rank{rank}.pt")  # fmt: skip


def test_a_tool_turn_costs_about_its_slowest_call_in_the_trainer(tiny_model_dir):
    """TRL runs a round's tool calls one rollout after another; RLVRTrainer sends them ahead together, so 8 cells
    that each sleep 0.5 s cost the round about 0.5 s, not 4 s, and each reply is still its own rollout's."""
    import time

    trainer = make_trainer(tiny_model_dir, max_steps=1)
    tokenizer = trainer.processing_class
    marks = []

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        marks.append(time.monotonic())
        out = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            results = re.findall(r"output: (.*?)<eos>", text, flags=re.S)
            if not results:
                question = re.findall(r"<user>(.*?)<eos>", text)[-1]
                reply = tool_call_text("python", code=f"import time\ntime.sleep(0.5)\n{question}")
            else:
                reply = f"\\boxed{{{results[-1].strip()}}}"
            out.append(tokenizer(reply + "<eos>", add_special_tokens=False)["input_ids"])
        marks.append(time.monotonic())
        return out, None

    trainer._generate_single_turn = generate
    _, _, completions = run_recorded(trainer)
    assert len(marks) == 4  # the first turn, the turn after the tool turn
    round_s = marks[2] - marks[1]
    assert round_s < 0.5 * 8 / 2, f"a turn of 8 cells of 0.5 s took {round_s:.2f} s"
    assert len(completions) == 8
    for turns in completions:  # each rollout got its own cell's reply
        calls = [m for m in turns if m.get("tool_calls")]
        tools = [m for m in turns if m.get("role") == "tool"]
        question = calls[0]["tool_calls"][0]["function"]["arguments"]["code"].splitlines()[-1]
        a, b = map(int, question.split("*"))
        assert tools[0]["content"].strip() == str(a * b)
