"""Row rules: a new stabilizer is one rule and one config field (trl_rlvr/sampling/row_rules.py), and the round driver
applies a rule's keep-time decision once, to the advantages, the loss mask and the token count."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import torch

from tests.sampling.test_driver import FLAT, INFORMATIVE, G, _args, driver_settings, make_driver, scripted_rounds
from trl_rlvr import RLVRConfig
from trl_rlvr.algorithms.multi_turn import score_as_wrong
from trl_rlvr.sampling import row_rules
from trl_rlvr.sampling.driver import RoundDriver
from trl_rlvr.sampling.row_rules import RowDecision, RowRule, ScoredRows


# ------------------------------------------------------------------------------------------- a new stabilizer
@dataclass
class LengthCapConfig(RLVRConfig):
    """RLVRConfig with the new stabilizer's one field."""

    max_answer_characters: int | None = field(
        default=None, metadata={"help": "An answer longer than this many characters scores as a wrong answer."})


class LongAnswersScoreAsWrong(RowRule):
    """The new stabilizer's one rule: at score time, an answer over ``max_answer_characters`` scores as wrong."""

    def __init__(self, limit: int):
        self.limit, self.flagged = limit, []

    @classmethod
    def of(cls, trainer):
        limit = getattr(trainer.args, "max_answer_characters", None)
        return None if limit is None else cls(limit)

    def score(self, rows: ScoredRows) -> torch.Tensor:
        long = rows.gather([len(text) > self.limit for text in rows.completions]).bool()
        self.flagged.append(long)
        return score_as_wrong(rows.rewards_per_func, long, rows.reward_weights)


def ones(completions, **kwargs):
    return [1.0] * len(completions)


def test_a_new_stabilizer_is_one_rule_and_one_field(tiny_model_dir, monkeypatch, tmp_path):
    """Registered with the rules and given a config field, the rule runs in training through the one pipeline: the
    rewards TRL logs, and the advantages, are those after the rule (long answers 0, short ones 1)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_rlvr import RLVRTrainer
    from trl_rlvr.testing import load_tokenizer

    monkeypatch.setattr(row_rules, "ROW_RULES", [*row_rules.ROW_RULES, LongAnswersScoreAsWrong])
    args = LengthCapConfig(
        output_dir=str(tmp_path), max_answer_characters=7, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, learning_rate=0.0, max_steps=1, bf16=False, report_to="none", logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0, use_cpu=True,
    )
    trainer = RLVRTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), reward_funcs=[ones],
        args=args, train_dataset=Dataset.from_dict({"prompt": [f"q{i}" for i in range(16)]}),
        processing_class=load_tokenizer(tiny_model_dir),
    )
    (rule,) = [r for r in trainer.row_rules if isinstance(r, LongAnswersScoreAsWrong)]
    trainer.train()
    long = torch.cat(rule.flagged)
    assert 0 < long.sum() < len(long), "the tiny model's answers should be of mixed lengths"
    logged = [h["rewards/ones/mean"] for h in trainer.state.log_history if "rewards/ones/mean" in h]
    assert logged == [pytest.approx(1 - long.float().mean().item())]


def test_a_rule_is_off_without_its_field(tiny_model_dir, monkeypatch):
    from tests.harness.loss_harness import make_trainer

    monkeypatch.setattr(row_rules, "ROW_RULES", [*row_rules.ROW_RULES, LongAnswersScoreAsWrong])
    assert make_trainer(tiny_model_dir).row_rules == []


# --------------------------------------------------------------------------------- keep-time decisions, merged
class TakeOutRow(RowRule):
    """A keep-time rule for the driver tests: the given rows of every round leave the loss (or are zeroed)."""

    def __init__(self, rows: list[int], how: str = "out_of_loss"):
        self.rows, self.how = rows, how

    def keep(self, record) -> RowDecision:
        mask = torch.zeros(len(record.rewards), dtype=torch.bool)
        mask[self.rows] = True
        return RowDecision(**{self.how: mask})


@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_a_row_out_of_the_loss_has_advantage_zero_no_loss_token_and_no_count(dynamic_sampling):
    rounds = [INFORMATIVE + INFORMATIVE]
    driver, _ = make_driver(rounds, rules=[TakeOutRow([1, 6])], dynamic_sampling=dynamic_sampling)
    batch, generation = (driver.informative_batch(8) if dynamic_sampling else
                         driver.one_round([{"prompt": "q"}] * 8, None))
    assert batch["advantages"][[1, 6]].tolist() == [0.0, 0.0]
    assert (batch["advantages"][[0, 2, 3, 4, 5, 7]] != 0).all()
    assert batch["completion_mask"][[1, 6]].sum() == 0 and batch["completion_mask"][[0, 2]].all()
    assert batch["num_items_in_batch"].item() == 6 * 3  # every row writes 3 tokens; two rows out
    assert generation.advantages[[1, 6]].tolist() == [0.0, 0.0]  # the table shows the advantage the loss used


def test_a_zeroed_row_keeps_its_loss_tokens_and_decisions_merge():
    driver, _ = make_driver([INFORMATIVE + INFORMATIVE], rules=[TakeOutRow([0], "zero_advantage"), TakeOutRow([5])],
                            dynamic_sampling=False)
    batch, _ = driver.one_round([{"prompt": "q"}] * 8, None)
    assert batch["advantages"][[0, 5]].tolist() == [0.0, 0.0]
    assert batch["completion_mask"][0].all() and not batch["completion_mask"][5].any()
    assert batch["num_items_in_batch"].item() == 7 * 3


def test_the_advantages_are_computed_once_over_the_kept_rows():
    """Dynamic sampling: compute_advantages is called once per generation batch, on the kept rows only."""
    calls = []
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    config = _args()
    settings = driver_settings(config, scripted_rounds([FLAT + INFORMATIVE, INFORMATIVE + FLAT], metrics), metrics)
    compute = settings["compute_advantages"]
    settings["compute_advantages"] = lambda rewards, size: calls.append(rewards.clone()) or compute(rewards, size)
    driver = RoundDriver(config, [{"prompt": f"q{i}"} for i in range(40)], **settings)
    driver.informative_batch(8)
    assert [c.tolist() for c in calls] == [INFORMATIVE + INFORMATIVE] and G == 4
