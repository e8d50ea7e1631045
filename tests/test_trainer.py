"""RLVRTrainer end to end on a tiny local model: real generation, rewards, advantages, diagnostics, config."""

import pytest
import torch

from tests.harness.loss_harness import make_trainer
from trl_rlvr.algorithms.advantages import group_advantages


def even_length(completions, **kwargs):
    """1.0 when the completion has an even number of characters: a deterministic, mixed reward."""
    return [float(len(c) % 2 == 0) for c in completions]


def test_real_steps_log_diagnostics_and_use_trl_advantages(tiny_model_dir):
    trainer = make_trainer(
        tiny_model_dir, reward_funcs=[even_length, "think_format"], max_steps=2, learning_rate=1e-3,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=8, overlong_buffer_length=4,
        overlong_penalty_factor=0.5, scale_rewards="group", temperature=1.0,
    )
    assert trainer.reward_func_names == ["even_length", "think_format", "overlong"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0, 0.5]  # overlong_penalty_factor is the overlong weight
    seen = []
    generate = trainer._generate_and_score_completions
    calculate = trainer._calculate_rewards

    def record_rewards(inputs, prompts, completions, completion_ids_list):
        rewards = calculate(inputs, prompts, completions, completion_ids_list)
        seen.append({"rewards": rewards.clone(), "lengths": [len(ids) for ids in completion_ids_list]})
        return rewards

    def record_output(inputs):
        out = generate(inputs)
        seen[-1]["advantages"] = out["advantages"].clone()
        return out

    trainer._calculate_rewards = record_rewards
    trainer._generate_and_score_completions = record_output
    trainer.train()

    for batch in seen:
        rewards = batch["rewards"]
        # the overlong column is DAPO's eq. 13 of each completion's length (L_max 8, L_cache 4: 0 up to 4 tokens,
        # then (4 - n) / 4), unweighted; its weight 0.5 scales it in the sum
        assert rewards[:, 2].tolist() == pytest.approx([min(0.0, (4 - n) / 4) for n in batch["lengths"]])
        total = (rewards * torch.tensor([1.0, 1.0, 0.5])).nansum(dim=1)
        torch.testing.assert_close(batch["advantages"], group_advantages(total, 4), atol=1e-5, rtol=1e-5)

    logged = {k for entry in trainer.state.log_history for k in entry}
    for key in ["rlvr/accuracy", "rlvr/zero_signal_frac", "rlvr/zero_signal_expected", "rlvr/clip_low_frac",
                "rlvr/clip_high_frac", "rlvr/truncated_frac", "rewards/overlong/mean"]:
        assert key in logged, key
    assert {"rlvr/length_right", "rlvr/length_wrong"} & logged
    first = trainer.state.log_history[0]
    assert 0.0 <= first["rlvr/accuracy"] <= 1.0


def test_success_reward_must_name_a_reward_function(tiny_model_dir):
    with pytest.raises(ValueError, match="success_reward='boxed'"):
        make_trainer(tiny_model_dir, reward_funcs=[even_length], success_reward="boxed")


def test_unknown_registry_name_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ValueError, match="boxed_math"):
        make_trainer(tiny_model_dir, reward_funcs=["boxed_maths"])


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"loss_normalization": "mode2"}, "loss_normalization='mode2' is not valid; allowed values: 'per_answer'"),
        ({"loss_type": "grpoo"}, "loss_type='grpoo'"),
        ({"loss_normalization": "per_answer", "loss_type": "dr_grpo"}, "conflicts with loss_type"),
        ({"loss_constant": 10}, "loss_constant is only used with loss_normalization='constant'"),
        ({"loss_normalization": "constant", "loss_constant": 0}, "loss_constant must be a positive"),
        ({"overlong_buffer_length": 64, "max_completion_length": 32}, "overlong_buffer_length"),
        ({"overlong_buffer_length": 8, "overlong_penalty_factor": -1.0}, "overlong_penalty_factor"),
        ({"epsilon_high": -0.1}, "epsilon_high"),
        ({"epsilon": 0.2, "epsilon_high": 0.1}, "epsilon_high (0.1) < epsilon (0.2)"),
        ({"scale_rewards": "std"}, "scale_rewards"),
        ({"max_sampling_rounds": -1}, "max_sampling_rounds"),
        ({"reward_options": "{not json"}, "reward_options"),
    ],
)
def test_config_validation_names_the_field(fields, message):
    from trl_rlvr import RLVRConfig

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RLVRConfig("/tmp/rlvr-test", bf16=False, report_to="none", **fields)


def test_config_maps_normalizations_to_trl_loss_types():
    from trl_rlvr import RLVRConfig

    kw = dict(output_dir="/tmp/rlvr-test", bf16=False, report_to="none", max_completion_length=64)
    assert RLVRConfig(**kw).loss_normalization == "per_batch_token"
    assert RLVRConfig(**kw, loss_type="grpo").loss_normalization == "per_answer"
    assert RLVRConfig(**kw, loss_normalization="constant").loss_type == "dr_grpo"
    assert RLVRConfig(**kw, loss_normalization="constant").effective_loss_constant == 64
    assert RLVRConfig(**kw, loss_normalization="constant", loss_constant=100).effective_loss_constant == 100
    assert RLVRConfig(**kw, reward_options='{"boxed_math": {"gold_column": "solution"}}').reward_options == {
        "boxed_math": {"gold_column": "solution"}
    }
    with pytest.warns(UserWarning, match="per_batch_token"):
        RLVRConfig(**kw, gradient_accumulation_steps=2, steps_per_generation=3)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_an_explicit_loss_type_conflicting_with_loss_normalization_is_an_error(loss_type):
    """Also when loss_type is TRL's own default ('dapo'): set by the user, it is a choice."""
    from trl_rlvr import RLVRConfig
    from trl_rlvr.config import LOSS_TYPE_OF

    kw = dict(output_dir="/tmp/rlvr-test", bf16=False, report_to="none")
    for normalization, wanted in LOSS_TYPE_OF.items():
        if wanted == loss_type:
            config = RLVRConfig(**kw, loss_type=loss_type, loss_normalization=normalization)
            assert (config.loss_type, config.loss_normalization) == (loss_type, normalization)
            continue
        with pytest.raises(ValueError, match=rf"loss_normalization='{normalization}' conflicts with "
                           rf"loss_type='{loss_type}'"):
            RLVRConfig(**kw, loss_type=loss_type, loss_normalization=normalization)


@pytest.mark.trl_contract
def test_loss_types_come_from_trl():
    """The loss types RLVRConfig accepts are the ones TRL's GRPOConfig.loss_type help lists."""
    from trl import GRPOConfig

    from trl_rlvr import RLVRConfig
    from trl_rlvr._compat.trl_contract import trl_loss_types
    from trl_rlvr.config import LOSS_TYPE_OF

    names = trl_loss_types()
    assert names and set(LOSS_TYPE_OF.values()) <= set(names)
    assert GRPOConfig.__dataclass_fields__["loss_type"].default in names
    assert RLVRConfig.__dataclass_fields__["loss_type"].metadata["choices"] == list(names)
    kw = dict(output_dir="/tmp/rlvr-test", bf16=False, report_to="none")
    for name in names:
        extra = {"importance_sampling_level": "sequence"} if name == "luspo" else {}
        assert RLVRConfig(**kw, loss_type=name, **extra).loss_type == name


def test_from_grpo_config_keeps_the_users_loss_type():
    from trl import GRPOConfig

    from trl_rlvr import RLVRConfig

    kw = dict(output_dir="/tmp/rlvr-test", bf16=False, report_to="none")
    for loss_type, normalization in (("grpo", "per_answer"), ("dapo", "per_batch_token"), ("bnpo", None)):
        config = RLVRConfig.from_grpo_config(GRPOConfig(**kw, loss_type=loss_type))
        assert (config.loss_type, config.loss_normalization) == (loss_type, normalization)
    default = RLVRConfig.from_grpo_config(GRPOConfig(**kw))
    assert default.loss_type == GRPOConfig.__dataclass_fields__["loss_type"].default


def test_overlong_switch_extends_reward_weights_without_touching_the_callers_config(tiny_model_dir, tmp_path):
    from datasets import Dataset

    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.testing import load_tokenizer

    args = RLVRConfig(str(tmp_path), bf16=False, report_to="none", per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, reward_weights=[2.0], overlong_buffer_length=4)
    trainer = RLVRTrainer(model=str(tiny_model_dir), reward_funcs=[even_length], args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
                          processing_class=load_tokenizer(tiny_model_dir))
    assert trainer.reward_func_names == ["even_length", "overlong"]
    assert trainer.reward_weights.tolist() == [2.0, 1.0]  # overlong_penalty_factor 1.0 (the default)
    assert args.reward_weights == [2.0]  # a second trainer from the same config gets the same weights


def test_success_reward_defaults_to_the_correctness_verifier(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, reward_funcs=["think_format", "boxed_math"])
    assert trainer.reward_func_names[trainer.success_reward_index] == "boxed_math"
    assert make_trainer(tiny_model_dir, reward_funcs=[even_length, "think_format"]).success_reward_index == 0


def test_require_finite_rewards_names_the_function_and_the_row():
    from trl_rlvr.algorithms.advantages import require_finite_rewards

    names = ["accuracy", "spiky"]
    nan = float("nan")
    require_finite_rewards(torch.tensor([[1.0, nan], [nan, 0.5], [0.0, -2.0]]), names)  # NaN: "not scored", allowed
    for bad in (float("inf"), float("-inf")):
        rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, bad], [bad, 1.0]])
        with pytest.raises(ValueError, match=r"reward function 'spiky' returned -?inf for row 2 .*2 non-finite rewards"):
            require_finite_rewards(rewards, names)


def test_an_infinite_reward_stops_training_naming_the_function(tiny_model_dir):
    """One inf reward used to become NaN or all-zero advantages without an error."""

    def spiky(completions, **kwargs):
        return [float("inf")] + [0.0] * (len(completions) - 1)

    trainer = make_trainer(tiny_model_dir, reward_funcs=[even_length, spiky], per_device_train_batch_size=8,
                           max_completion_length=8, scale_rewards="none")
    with pytest.raises(ValueError, match="reward function 'spiky' returned inf for row 0"):
        trainer.train()


def check_fails_on_the_first_of_each_group(completions, **kwargs):
    """A correctness check whose machinery failed (None) on every 4th row, else the even-length verdict."""
    return [None if i % 4 == 0 else float(len(c) % 2 == 0) for i, c in enumerate(completions)]


check_fails_on_the_first_of_each_group.verifies_correctness = True  # the success reward (the default check)


def always_formatted(completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("advantage_std", ["population", "sample"])  # ours, and TRL's own advantages
def test_a_row_whose_check_returned_none_is_unscorable_as_a_whole(tiny_model_dir, advantage_std):
    """With a format reward beside the check, TRL's nansum would train the row as a wrong answer with its format
    score; the row is unscorable as a whole: all its rewards NaN, advantage 0, out of its group's baseline."""
    trainer = make_trainer(tiny_model_dir, reward_funcs=[always_formatted, check_fails_on_the_first_of_each_group],
                           per_device_train_batch_size=8, max_completion_length=8, temperature=1.0,
                           advantage_std=advantage_std, scale_rewards="none")
    seen = []
    generate, calculate = trainer._generate_and_score_completions, trainer._calculate_rewards

    def record_rewards(*args):
        seen.append({"rewards": calculate(*args).clone()})
        return seen[-1]["rewards"]

    def record_output(inputs):
        out = generate(inputs)
        seen[-1]["advantages"] = out["advantages"].clone()
        return out

    trainer._calculate_rewards, trainer._generate_and_score_completions = record_rewards, record_output
    trainer.train()
    (batch,) = seen
    rewards, advantages = batch["rewards"], batch["advantages"]
    failed = torch.arange(len(rewards)) % 4 == 0
    assert rewards[failed].isnan().all() and not rewards[~failed].isnan().any()
    assert (advantages[failed] == 0).all()
    for group in range(len(rewards) // 4):  # the baseline is the mean of the 3 scored rows of the group
        rows = torch.arange(4 * group + 1, 4 * group + 4)
        totals = rewards[rows].sum(dim=1)
        torch.testing.assert_close(advantages[rows], totals - totals.mean(), atol=1e-5, rtol=0)
    assert [e["rlvr/unscorable_frac"] for e in trainer.state.log_history if "rlvr/unscorable_frac" in e] == [0.25]


def test_correctness_rewards_name_the_checks(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, reward_funcs=[always_formatted, check_fails_on_the_first_of_each_group],
                           correctness_rewards=[])  # TRL's rule only: a row leaves only when every function is None
    assert trainer._correctness_checks == []
    assert make_trainer(tiny_model_dir, reward_funcs=[always_formatted, check_fails_on_the_first_of_each_group]
                        )._correctness_checks == [1]  # default: the success reward
    with pytest.raises(ValueError, match=r"correctness_rewards names \['boxed'\]"):
        make_trainer(tiny_model_dir, reward_funcs=[always_formatted], correctness_rewards=["boxed"])
