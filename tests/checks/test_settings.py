"""Mistakes reported before any model loads, naming the field or column.

Each case gives a model path that does not exist: the error asserted is raised instead of the model's
"not found", so it comes before the model is opened."""

import importlib.util
import json
import tempfile
import warnings

import pytest

MISSING_MODEL = "/nonexistent/model-that-would-fail-to-load"


def config(**overrides):
    from trl_rlvr import RLVRConfig

    settings = dict(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none",
                    per_device_train_batch_size=4, num_generations=4)
    settings.update(overrides)
    return RLVRConfig(**settings)


def trainer_with(dataset, reward_funcs):
    from trl_rlvr import RLVRTrainer

    return RLVRTrainer(model=MISSING_MODEL, reward_funcs=reward_funcs, args=config(), train_dataset=dataset)


def test_dataset_without_the_gold_column_a_reward_reads():
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": ["What is 1 + 1?"], "question": ["What is 1 + 1?"]})
    with pytest.raises(ValueError, match=r"train_dataset lacks the column 'answer' or 'solution', which the reward "
                                         r"function 'boxed_math' reads\. Its columns: \['prompt', 'question'\]"):
        trainer_with(dataset, ["boxed_math"])
    with pytest.raises(ValueError, match="column 'gold'.*'boxed_math'"):
        from trl_rlvr import RLVRTrainer

        RLVRTrainer(model=MISSING_MODEL, reward_funcs=["boxed_math"], train_dataset=dataset,
                    args=config(reward_options={"boxed_math": {"gold_column": "gold", "prestart": False}}))
    with pytest.raises(ValueError, match="'tests' or 'test' or 'io_tests'.*'code_sandbox'"):
        trainer_with(dataset, ["code_sandbox"])
    with pytest.raises(ValueError, match="'solution', which the reward function 'accuracy_reward'"):
        trainer_with(dataset, ["accuracy_reward"])


def test_dataset_without_prompt():
    from datasets import Dataset

    with pytest.raises(ValueError, match=r"train_dataset lacks the column 'prompt'.*Its columns: \['answer', 'text'\]"):
        trainer_with(Dataset.from_dict({"text": ["What is 1 + 1?"], "answer": ["2"]}), ["boxed_math"])


def test_recipe_columns_checked_before_the_model(tmp_path, tiny_model_dir, monkeypatch):
    """The recipe's data columns fail when the data loads; the rewards' columns once, in RLVRTrainer, on the dataset
    the recipe built, before GRPOTrainer loads the model (made to fail here if it is reached)."""
    import trl

    from trl_rlvr.scripts.train import main

    def model_loads(*args, **kwargs):
        raise AssertionError("the model was loaded before the columns were checked")

    monkeypatch.setattr(trl.GRPOTrainer, "__init__", model_loads)
    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(8)))
    base = ["--model_name_or_path", MISSING_MODEL, "--dataset_name", str(data), "--num_eval_samples", "2", "--use_cpu",
            "true", "--bf16", "false", "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
    with pytest.raises(ValueError, match=r"column 'question' \(question_column\) is not in dataset .*'problem'"):
        main(base)
    base[1] = str(tiny_model_dir)
    with pytest.raises(ValueError, match="train_dataset lacks the column 'tests' or 'test' or 'io_tests', which the "
                                         "reward function 'code_sandbox' reads"):
        main([*base, "--question_column", "problem", "--reward_funcs", "code_sandbox"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_use_vllm_without_vllm_fails_at_config_time(tmp_path):
    from pathlib import Path

    from trl_rlvr.scripts.train import main

    with pytest.raises(ImportError, match=r"use_vllm=True \(vllm_mode='colocate'\) needs vLLM"):
        config(use_vllm=True)
    recipe = Path(__file__).resolve().parents[2] / "examples" / "recipes" / "dapo.yaml"  # use_vllm: true
    with pytest.raises(ImportError, match="use_vllm=True"):
        main(["--config", str(recipe), "--model_name_or_path", MISSING_MODEL, "--bf16", "false", "--use_cpu", "true",
              "--output_dir", str(tmp_path)])


@pytest.mark.parametrize("fields,message", [
    ({"max_sampling_rounds": 5}, "max_sampling_rounds=5 has no effect without dynamic_sampling=True"),
    ({"dynamic_sampling_tolerance": 0.1}, "dynamic_sampling_tolerance=0.1 has no effect without dynamic_sampling"),
    ({"dynamic_sampling_oversample": 2.0}, "dynamic_sampling_oversample=2.0 has no effect without dynamic_sampling"),
    ({"revisit_probability": 0.5}, "revisit_probability=0.5 has no effect without selective_sampling=True"),
    ({"selective_sampling_window": 3}, "selective_sampling_window=3 has no effect without selective_sampling=True"),
    ({"dynamic_sampling_oversample": 2.0, "selective_sampling": True},
     "dynamic_sampling_oversample=2.0 has no effect without dynamic_sampling=True"),
    ({"overlong_penalty_factor": 0.5}, "overlong_penalty_factor=0.5 has no effect without overlong_buffer_length"),
    ({"token_count_scope": "generation_batch", "loss_normalization": "per_answer"},
     "token_count_scope='generation_batch' has no effect without loss_normalization='per_batch_token'"),
    ({"advantage_std": "sample", "scale_rewards": "none"}, "advantage_std='sample' has no effect without scale_rewards"),
    ({"resample_on_correct_oversample": 4}, "resample_on_correct_oversample=4 has no effect without resample_on_correct"),
    ({"policy_shift_alarm_token_nats": 3.0},
     "policy_shift_alarm_token_nats=3.0 has no effect without policy_shift_metrics=True"),
    ({"policy_shift_alarm_nats": 2.0}, "policy_shift_alarm_nats=2.0 has no effect without policy_shift_metrics=True"),
    ({"policy_shift_alarm_kl": 0.1}, "policy_shift_alarm_kl=0.1 has no effect without policy_shift_metrics=True"),
])
def test_options_without_effect_warn(fields, message):
    with pytest.warns(UserWarning, match=message):
        config(**fields)


def test_no_warning_where_options_act():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        config()
        config(dynamic_sampling=True, max_sampling_rounds=5, dynamic_sampling_tolerance=0.1)
        config(selective_sampling=True, revisit_probability=0.5, dynamic_sampling_metric="success",
               dynamic_sampling_tolerance=0.1)
        config(max_completion_length=64, overlong_buffer_length=16, overlong_penalty_factor=0.5)
        config(token_count_scope="generation_batch", advantage_std="sample")
        config(resample_on_correct=True, resample_on_correct_oversample=4, void_turn_action="drop",
               max_tool_calls_per_answer=3, tool_error_reply="last_line")
        config(policy_shift_metrics=True, policy_shift_alarm_nats=2.0, policy_shift_alarm_kl=0.1)


@pytest.mark.parametrize("fields,message", [
    ({"void_turn_action": "zero"}, "void_turn_action='zero' is not valid; allowed values: 'off', 'zero_advantage', 'drop', 'score_as_wrong'"),
    ({"max_tool_calls_per_answer": 0}, "max_tool_calls_per_answer must be an integer >= 1"),
    ({"max_tool_calls_per_answer": True}, "max_tool_calls_per_answer must be an integer >= 1"),
    ({"tool_error_reply": "short"}, "tool_error_reply='short' is not valid; allowed values: 'full', 'last_line'"),
    ({"resample_on_correct": True, "resample_on_correct_oversample": 1}, "resample_on_correct_oversample must be"),
    ({"policy_shift_metrics": True, "policy_shift_alarm_nats": 0.0}, "policy_shift_alarm_nats must be > 0"),
    ({"policy_shift_metrics": True, "policy_shift_alarm_token_nats": 0}, "policy_shift_alarm_token_nats must be > 0"),
    ({"policy_shift_metrics": True, "policy_shift_alarm_kl": -1.0}, "policy_shift_alarm_kl must be > 0"),
])
def test_multi_turn_and_shift_fields_are_checked_naming_the_field(fields, message):
    import re

    with pytest.raises(ValueError, match=re.escape(message)):
        config(**fields)


def test_the_alarm_bounds_default_to_the_documented_ones():
    from trl_rlvr.algorithms.policy_shift import SHIFT_ALARM_TOKEN_NATS

    built = config()
    assert built.policy_shift_alarm_token_nats == SHIFT_ALARM_TOKEN_NATS
    assert built.policy_shift_alarm_nats is None and built.policy_shift_alarm_kl is None


def test_bf16_on_cpu_warns_once_per_process(monkeypatch):
    from trl_rlvr.checks import settings

    monkeypatch.setattr(settings, "_warned_bf16_on_cpu", False)
    with pytest.warns(UserWarning, match=r"bf16=True on a CPU .* Set bf16=False"):
        config(bf16=True)
    with warnings.catch_warnings(record=True) as caught:  # a second config (a test suite, a sweep): said already
        warnings.simplefilter("always")
        config(bf16=True)
    assert not [w for w in caught if "bf16=True on a CPU" in str(w.message)]
