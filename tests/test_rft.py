"""Rejection-sampling fine-tuning (trl_rlvr.supervised.rejection_sampling) on the tiny model driven to use the
sandboxed Python tool (trl_rlvr.testing.scripted_tool_model): what is accepted passed the reward and what is
rejected did not, the dataset round-trips through save_to_disk, the SFT step (assistant-only loss) runs and changes
the weights, expert iteration samples from the last model, the command line runs, and bad settings, columns and
paths are named."""

import functools
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness.tool_eval_harness import boxed_product, questions
from trl_rlvr.supervised.fine_tune import SFTSettings
from trl_rlvr.supervised.rejection_sampling import (
    REJECTIONS,
    RFTSettings,
    acceptance_reward,
    load_accepted,
    rejection_sample,
    rejection_sampling_fine_tune,
    save_accepted,
)
from trl_rlvr.testing import TOOL_CHAT_TEMPLATE

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

#: The tiny model's tool template with {% generation %} around what the assistant writes (SFT's assistant-only
#: loss); it renders the same text.
TRAINING_TEMPLATE = TOOL_CHAT_TEMPLATE.replace(
    "<assistant>{{ message['content'] }}", "<assistant>{% generation %}{{ message['content'] }}").replace(
    "{%- endfor -%}<eos>", "{%- endfor -%}<eos>{% endgeneration %}", 1)
SETTINGS = dict(num_samples=4, max_new_tokens=160, batch_size=28, seed=0)


def environment():
    from reward_plugins.code_sandbox import PythonEnvironment

    return functools.partial(PythonEnvironment, timeout=5.0)


def scripted(path):
    from trl_rlvr.testing.scripted_tool_model import load_scripted_tool_model

    model, tokenizer = load_scripted_tool_model(path)
    tokenizer.chat_template = TRAINING_TEMPLATE
    return model, tokenizer


def answer_of(row, prompt_length):
    return row["messages"][prompt_length:]


def without_nulls(value):
    """``value`` without the null fields Arrow adds to unify the structs of a column."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


@pytest.fixture(scope="module")
def sampled(tiny_model_dir):
    """One round on the 7 questions x 4 samples, every rule off but the reward's, and the default rules."""
    model, tokenizer = scripted(tiny_model_dir)
    loose = RFTSettings(**SETTINGS, require_finished=False, require_clean_tool_calls=False, unique=False)
    return (rejection_sample(model, tokenizer, questions(), boxed_product, loose, environment_factory=environment()),
            rejection_sample(model, tokenizer, questions(), boxed_product, RFTSettings(**SETTINGS),
                             environment_factory=environment()))


def test_accepted_samples_passed_the_reward_and_rejected_ones_did_not(sampled):
    (accepted, rejected, metrics), (strict, strict_rejected, strict_metrics) = sampled
    rows = list(questions())
    assert metrics["samples"] == len(accepted) + len(rejected) == 28 and 0 < len(accepted) < 28
    for row in accepted + rejected:  # the reward, called again on what was stored
        question = rows[row["question_index"]]
        score = boxed_product([answer_of(row, len(question["prompt"]))], [question["answer"]])[0]
        assert score == (1.0 if "rejected" not in row else 0.0), row
        assert row["messages"][: len(question["prompt"])] == question["prompt"] and row["reference"] == question["answer"]
    # the same samples (seeded) under the default rules: a subset, each drop with its reason
    assert strict_metrics["samples"] == 28 and {r["rejected"] for r in strict_rejected} <= set(REJECTIONS)
    key = lambda r: (r["question_index"], r["sample_index"])  # noqa: E731
    assert {key(r) for r in strict} <= {key(r) for r in accepted}
    assert sum(strict_metrics["rejected"].values()) + len(strict) == 28
    for row in strict:  # every call parsed and ran, and the rollout ended with EOS
        calls = [m for m in answer_of(row, 1) if m["role"] == "assistant" and m.get("tool_calls")]
        assert calls and all(c["tool_calls"][0]["function"]["name"] == "python" for c in calls)
    assert strict_metrics["generated_tokens"] == metrics["generated_tokens"] > strict_metrics["accepted_tokens"] > 0


@st.composite
def evaluations(draw):
    """Per-question records as evaluate_sampled(keep_completions=True) writes them, with tool counts."""
    questions = draw(st.integers(1, 4))
    n = draw(st.integers(1, 5))
    records = []
    for q in range(questions):
        flag = st.lists(st.booleans(), min_size=n, max_size=n)
        texts = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))  # duplicates are likely
        records.append({"index": q, "right_flags": draw(flag), "finished": draw(flag), "lengths": [3] * n,
                        "completions": [[{"role": "assistant", "content": t}] for t in texts],
                        "tool": {"parse_failures": [int(x) for x in draw(flag)],
                                 "call_failures": [int(x) for x in draw(flag)]}})
    rows = [{"prompt": [{"role": "user", "content": f"q{q}"}], "answer": str(q)} for q in range(questions)]
    return rows, records


@settings(max_examples=60, deadline=None)
@given(evaluations(), st.booleans(), st.booleans(), st.booleans(), st.sampled_from([None, 1, 2]))
def test_every_sample_is_kept_or_rejected_for_the_first_rule_it_breaks(data, finished, clean, unique, cap):
    from trl_rlvr.supervised.rejection_sampling import split_samples

    rows, records = data
    config = RFTSettings(require_finished=finished, require_clean_tool_calls=clean, unique=unique,
                         max_per_prompt=cap)
    accepted, rejected = split_samples(rows, records, config)
    assert len(accepted) + len(rejected) == sum(len(r["right_flags"]) for r in records)
    for row in accepted + rejected:
        record, j = records[row["question_index"]], row["sample_index"]
        broken = [rule for rule, bad in (
            ("reward", not record["right_flags"][j]), ("unfinished", finished and not record["finished"][j]),
            ("tool_calls", clean and (record["tool"]["parse_failures"][j] or record["tool"]["call_failures"][j])),
        ) if bad]
        assert row.get("rejected") == (broken[0] if broken else row.get("rejected")), row
        if not broken:
            assert row.get("rejected") in (None, "duplicate", "over_cap")
        assert row["messages"][-1] == record["completions"][j][0] and row["reference"] == str(row["question_index"])
    for q in range(len(records)):
        mine = [r["messages"][-1]["content"] for r in accepted if r["question_index"] == q]
        assert cap is None or len(mine) <= cap
        assert not unique or len(mine) == len(set(mine))
        for row in rejected:  # a duplicate repeats a kept answer; over the cap only once the cap is full
            if row["question_index"] == q and row["rejected"] == "duplicate":
                assert row["messages"][-1]["content"] in mine
            if row["question_index"] == q and row["rejected"] == "over_cap":
                assert len(mine) == cap


def test_acceptance_needs_every_reward_above_its_threshold():
    success = lambda **kw: [1.0, 0.5, None, 1.0]  # noqa: E731
    fmt = lambda **kw: [1.0, 1.0, 1.0, 0.0]  # noqa: E731
    assert acceptance_reward(success, 1.0)() == [1.0, 0.0, None, 1.0]
    assert acceptance_reward(success, 0.5)() == [1.0, 1.0, None, 1.0]
    assert acceptance_reward(success, 1.0, fmt, 1.0)() == [1.0, 0.0, None, 0.0]


def test_the_dataset_round_trips(sampled, tmp_path):
    accepted = sampled[1][0]
    save_accepted(accepted, tmp_path / "accepted")
    loaded = load_accepted(tmp_path / "accepted")
    assert len(loaded) == len(accepted) and [without_nulls(dict(r)) for r in loaded] == without_nulls(accepted)
    assert json.loads(loaded[0]["tools"])[0]["function"]["name"] == "python"
    save_accepted([], tmp_path / "empty")
    assert len(load_accepted(tmp_path / "empty")) == 0


def test_the_sft_rows_carry_loss_on_the_assistant_turns_only(sampled, tiny_model_dir):
    """What SFTTrainer's assistant-only loss trains on (the template's generation marks): the calls and the boxed
    answer, not the prompt or the tool's reply."""
    _, tokenizer = scripted(tiny_model_dir)
    row = sampled[1][0][0]
    out = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    trained = tokenizer.decode([t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m])
    assert "\\boxed{" in trained and '"python"' in trained and "output: " not in trained and "What is" not in trained


@pytest.mark.slow
def test_rft_end_to_end_with_expert_iteration(tiny_model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    _, tokenizer = scripted(tiny_model_dir)
    settings = RFTSettings(**SETTINGS, iterations=2, max_per_prompt=2)
    data = questions().select(range(4))  # 4 questions x 4 samples a round
    sft = SFTSettings(epochs=1, learning_rate=1e-3, batch_size=4, micro_batch_size=2, use_cpu=True)
    loaded = []

    def load(path):
        loaded.append(path)
        return scripted(path)[0]

    report = rejection_sampling_fine_tune(tiny_model_dir, tokenizer, data, boxed_product, tmp_path / "rft", settings,
                                          sft, environment_factory=environment(), load_model=load)
    assert loaded == [str(tiny_model_dir), str(tmp_path / "rft" / "iteration_0" / "model")]  # the last model samples
    assert report["model"] == str(tmp_path / "rft" / "iteration_1" / "model")
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    for i, round_ in enumerate(report["iterations"]):
        accepted = load_accepted(round_["dataset"])
        assert len(accepted) == round_["accepted"] > 0 and set(accepted["iteration"]) == {i}
        assert max(sum(q == k for q in accepted["question_index"]) for k in range(4)) <= 2  # max_per_prompt
        assert round_["sft_steps"] == -(-round_["accepted"] // 4) and all(x > 0 for x in round_["sft_loss"])
        trained = load_file(str(tmp_path / "rft" / f"iteration_{i}" / "model" / "model.safetensors"))
        assert any(not torch.equal(base[k], trained[k]) for k in base)  # the SFT step changed the weights
    assert json.loads((tmp_path / "rft" / "rft_metrics.json").read_text())["iterations"] == report["iterations"]
    with pytest.raises(ValueError, match="rft_metrics.json"):  # a finished run is not overwritten
        rejection_sampling_fine_tune(tiny_model_dir, tokenizer, data, boxed_product, tmp_path / "rft", settings, sft,
                                     environment_factory=environment(), load_model=load)


def test_text_prompts_train_on_the_completion(tiny_model_dir, tmp_path):
    """Text prompts (no tool): prompt-completion rows, TRL's completion-only loss."""
    from datasets import Dataset

    from trl_rlvr.testing import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    data = Dataset.from_list([{"prompt": f"Q{i}: ", "answer": "a"} for i in range(4)])

    settings = RFTSettings(num_samples=4, max_new_tokens=12, require_finished=False, seed=3)
    report = rejection_sampling_fine_tune(tiny_model_dir, tokenizer, data, has_letter, tmp_path / "rft", settings,
                                          SFTSettings(epochs=1, batch_size=2, micro_batch_size=2, use_cpu=True))
    rows = load_accepted(report["iterations"][0]["dataset"])
    assert len(rows) > 0 and all("a" in r["completion"] and r["prompt"].startswith("Q") for r in rows)
    assert report["iterations"][0]["sft_steps"] >= 1


def has_letter(completions, answer, **kwargs):
    """1 when the text holds the reference letter (the tiny random model writes it now and then)."""
    return [float(gold in text) for text, gold in zip(completions, answer)]


def test_the_command_line_runs_and_names_bad_options(tiny_model_dir, tmp_path, capsys):
    from trl_rlvr.scripts.cli import main

    questions_file = tmp_path / "q.jsonl"
    questions_file.write_text("".join(json.dumps({"prompt": f"Q{i}: ", "answer": "a"}) + "\n" for i in range(4)))
    common = [str(tiny_model_dir), "--dataset", str(questions_file), "--prompt_column", "prompt", "--reward",
              "tests.test_rft:has_letter", "--n", "4", "--max_new_tokens", "12", "--seed", "3", "--keep_unfinished"]
    sft = ["--sft_batch_size", "2", "--sft_micro_batch_size", "2", "--sft_epochs", "1"]
    assert main(["rft", *common, *sft, "--output_dir", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "rft_metrics.json").read_text())
    rows = load_accepted(tmp_path / "out" / "iteration_0" / "accepted")
    assert len(rows) == report["iterations"][0]["accepted"] > 0 and all("a" in r["completion"] for r in rows)
    assert report["model"].endswith("iteration_0/model") and report["settings"]["num_samples"] == 4
    for extra, named in ((["--n", "0"], "--n"), (["--sft_batch_size", "3"], "--sft_batch_size"),
                         (["--iterations", "2", "--no_train"], "--iterations"), (["--k", "1"], "--k"),
                         (["--response_template", "nope"], "--response_template"), (["--prompt_column", "nope"], "nope"), (["--dataset", str(tmp_path / "none.jsonl")],
                                                                 "none.jsonl")):
        capsys.readouterr()
        assert main(["rft", *common, *extra, "--output_dir", str(tmp_path / "bad")]) == 2, extra
        assert named in capsys.readouterr().err, extra


def test_bad_settings_columns_and_paths_are_named(tiny_model_dir, tmp_path):
    from datasets import Dataset

    for field, value in (("num_samples", 0), ("iterations", 0), ("threshold", float("nan")), ("max_per_prompt", 0)):
        with pytest.raises(ValueError, match=field):
            RFTSettings(**{field: value})
    with pytest.raises(ValueError, match="micro_batch_size"):
        SFTSettings(batch_size=3, micro_batch_size=2)
    with pytest.raises(ValueError, match="'prompt'"):
        rejection_sample(None, None, [{"question": "q"}], boxed_product, RFTSettings())
    with pytest.raises(ValueError, match=str(tmp_path / "nowhere")):
        load_accepted(tmp_path / "nowhere")
    Dataset.from_list([{"text": "x"}]).save_to_disk(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="'messages'"):
        load_accepted(tmp_path / "plain")
    from trl_rlvr.supervised.fine_tune import sft_dataset

    with pytest.raises(ValueError, match="row 1"):
        sft_dataset([{"messages": []}, {"text": "x"}])
