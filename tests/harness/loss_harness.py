"""Gradient check of RLVRTrainer's loss against a reference written straight from the formulas.

The trainer runs its real `train()` loop (shuffling, splitting into micro-batches, gradient accumulation,
DDP all-reduce across processes) on a FIXED global batch: `_generate_and_score_completions` is replaced by
a function returning this process's slice of that batch, laid out as TRL lays it out. The gradient is read
in `on_pre_optimizer_step` (after accumulation and all-reduce; no clipping, learning rate 0).

The reference below does not use TRL: one forward pass of the same weights over the rows of an optimizer
step, the PPO-clip token loss, and the normalization of `RLVRConfig`'s docstring.

Run directly (also under `accelerate launch`) to write the gradients of every optimizer step to a file:
    python -m tests.harness.loss_harness MODEL_DIR OUT.pt NORMALIZATION[,NORMALIZATION...] [SPG GA [ADVANTAGE_BASELINE]]
"""

from __future__ import annotations

import math
import os
import sys

import torch

GLOBAL_ROWS = 8  # answers in one generation batch (2 questions x G=4)
GROUP_SIZE = 4
PROMPT_LEN = 5
MAX_COMPLETION = 7
NORMALIZATIONS = ["per_answer", "per_batch_token", "constant"]


def fixed_batch(vocab_size: int, seed: int = 1234) -> dict[str, torch.Tensor]:
    """A global generation batch: equal-length prompts, completions of varying length, fixed advantages."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(10, vocab_size, (GLOBAL_ROWS, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(10, vocab_size, (GLOBAL_ROWS, MAX_COMPLETION), generator=g)
    lengths = torch.tensor([1, 7, 3, 5, 2, 7, 4, 6])
    completion_mask = (torch.arange(MAX_COMPLETION)[None] < lengths[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, 0)  # pad id 0
    advantages = torch.randn(GLOBAL_ROWS, generator=g)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
    }


def reference_loss(model, rows: dict[str, torch.Tensor], normalization: str, num_rows_in_step: int,
                   constant: int = MAX_COMPLETION, epsilon=0.2, epsilon_high=0.28) -> torch.Tensor:
    """The loss of one optimizer step over ALL its rows (every process, every micro-step), from the formulas."""
    input_ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
    attention_mask = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    completion_logits = logits[:, rows["prompt_ids"].size(1) - 1 : -1]
    logp = torch.log_softmax(completion_logits.float(), dim=-1).gather(-1, rows["completion_ids"][..., None])[..., 0]
    old = rows.get("old_per_token_logps", logp.detach())
    ratio = torch.exp(logp - old)
    adv = rows["advantages"][:, None]
    token_loss = -torch.minimum(ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon_high) * adv)
    mask = rows["completion_mask"].float()
    if "tool_mask" in rows:  # multi-turn: the tools' results are not the model's tokens
        mask = mask * rows["tool_mask"].float()
    summed = (token_loss * mask).sum(dim=1)
    if normalization == "per_answer":
        return (summed / mask.sum(dim=1).clamp(min=1)).sum() / num_rows_in_step
    if normalization == "per_batch_token":
        return summed.sum() / mask.sum()
    if normalization == "constant":
        return summed.sum() / (num_rows_in_step * constant)
    raise ValueError(normalization)


def reference_grads(model_dir, rows, normalization, **kw) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    loss = reference_loss(model, rows, normalization, num_rows_in_step=rows["prompt_ids"].size(0), **kw)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def make_trainer(model_dir, reward_funcs=None, model=None, peft_config=None, **overrides):
    """An RLVRTrainer on the tiny model with CPU settings; `overrides` are RLVRConfig fields.

    ``model`` replaces the fp32 model loaded from ``model_dir`` (e.g. a 4-bit one); ``peft_config`` goes to the trainer.
    """
    import tempfile

    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.testing import load_tokenizer

    settings = dict(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, num_generations=GROUP_SIZE,
        max_completion_length=MAX_COMPLETION, epsilon=0.2, epsilon_high=0.28, learning_rate=0.0,
        max_grad_norm=0.0, max_steps=1, bf16=False, activation_checkpointing=False, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
    )
    settings.update(overrides)
    tokenizer = load_tokenizer(model_dir)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": [f"q{i}" for i in range(64)], "answer": ["0"] * 64})  # a gold for boxed_math
    if reward_funcs is None:
        reward_funcs = [lambda completions, **_: [0.0] * len(completions)]
    return RLVRTrainer(model=model, reward_funcs=reward_funcs, args=RLVRConfig(**settings),
                       train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config)


#: Rewards of the fixed batch's two groups, for runs where the trainer computes the advantages itself.
FIXED_REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0])


def reference_advantages(rewards: torch.Tensor, baseline: str, scale_rewards: str, eps: float = 1e-4,
                         group_size: int = GROUP_SIZE, dtype=torch.float32) -> torch.Tensor:
    """Advantages written out answer by answer: r_i minus the group mean (itself included) or the mean of the
    others, divided by the group's population std ("group") or not at all ("none"). NaN rewards (unscored) are
    left out of every statistic and get 0, as does an answer with no scored other (leave-one-out)."""
    out = []
    for group in rewards.double().view(-1, group_size).tolist():
        scored = [r for r in group if not math.isnan(r)]
        mean = sum(scored) / len(scored) if scored else 0.0
        std = (sum((r - mean) ** 2 for r in scored) / len(scored)) ** 0.5 if scored else 0.0
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i and not math.isnan(x)]
            if math.isnan(r) or (baseline == "leave_one_out" and not others):
                out.append(0.0)
                continue
            a = r - (mean if baseline == "group_mean" else sum(others) / len(others))
            out.append(a / (std + eps) if scale_rewards == "group" else a)
    return torch.tensor(out, dtype=dtype)


def run_trainer(model_dir, normalization: str, steps_per_generation: int = 2, grad_accum: int = 2,
                num_optimizer_steps: int = 1, loss_constant: int | None = None, rewards: torch.Tensor | None = None,
                **config):
    """Train on the fixed batch; return (grads per optimizer step, rows of each optimizer step, trainer).

    With ``rewards``, the advantages are left to the trainer: TRL's generation step is replaced at the
    ``GRPOTrainer`` level, so RLVRTrainer's own advantage computation (``config``: e.g. ``advantage_baseline``,
    ``scale_rewards``) runs on those global rewards."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import TrainerControl

    # From the launcher's environment: a bare accelerate.PartialState() built before the trainer's Accelerator
    # reads ACCELERATE_USE_CPU says "1 process, rank 0" on every CPU rank, and every rank would then train
    # on the whole batch (the DDP average of equal gradients hides it).
    num_processes, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    trainer = make_trainer(
        model_dir,
        loss_normalization=normalization,
        loss_constant=loss_constant,
        per_device_train_batch_size=GLOBAL_ROWS // (num_processes * steps_per_generation),
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation,
        max_steps=num_optimizer_steps,
        **config,
    )
    assert (trainer.accelerator.num_processes, trainer.accelerator.process_index) == (num_processes, rank)
    batch = fixed_batch(len(trainer.processing_class))
    local = slice(rank * GLOBAL_ROWS // num_processes, (rank + 1) * GLOBAL_ROWS // num_processes)

    def fake_generate(inputs):
        out = {k: v[local].clone() for k, v in batch.items()}
        out["num_items_in_batch"] = batch["completion_mask"].sum()  # global, as TRL computes it
        return out

    if rewards is None:
        trainer._generate_and_score_completions = fake_generate
    else:
        from trl import GRPOTrainer

        def fake_trl_generate(self, inputs):  # what TRL's step leaves behind: the gathered rewards, local rows
            notes = self._round_notes
            notes.rewards, notes.rewards_per_func = rewards.clone(), rewards.clone()[:, None]
            notes.lengths = batch["completion_mask"].sum(dim=1).float()
            notes.truncated = torch.zeros(len(rewards), dtype=torch.bool)
            out = fake_generate(inputs)
            out["advantages"] = torch.full_like(out["advantages"], float("nan"))  # must be recomputed
            return out

        trl_generate = GRPOTrainer._generate_and_score_completions
        GRPOTrainer._generate_and_score_completions = fake_trl_generate
    step_rows: list[list[torch.Tensor]] = [[]]
    original_compute_loss = trainer.compute_loss

    def recording_compute_loss(model, inputs, *a, **k):
        step_rows[-1].append(inputs["completion_ids"].clone())
        return original_compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = recording_compute_loss
    grads: list[dict[str, torch.Tensor]] = []

    class GradCatcher(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs) -> TrainerControl:
            grads.append({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
                          if p.grad is not None})
            step_rows.append([])
            return control

    trainer.add_callback(GradCatcher())
    try:
        trainer.train()
    finally:
        if rewards is not None:
            GRPOTrainer._generate_and_score_completions = trl_generate
    # This process's rows of each step -> global rows (each process logs its own; gather them).
    rows_per_step = [torch.cat(r) for r in step_rows[:-1]]
    if num_processes > 1:
        from accelerate.utils import gather_object

        rows_per_step = [torch.cat(gather_object([r])) for r in rows_per_step]
    return grads, rows_per_step, trainer


def select_rows(batch: dict[str, torch.Tensor], completion_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows of `batch` whose completion ids match `completion_ids` (in that order)."""
    index = [int((batch["completion_ids"] == row).all(dim=1).nonzero()[0]) for row in completion_ids]
    return {k: v[index] for k, v in batch.items()}


def strip_ddp_prefix(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): g for n, g in grads.items()}


def assert_grads_equal(got, want, atol=1e-6):
    got = strip_ddp_prefix(got)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=1e-5, msg=f"gradient of {name}")
    assert max(g.abs().max().item() for g in want.values()) > 1e-3  # the check is not vacuous


if __name__ == "__main__":
    model_dir, out_path, norms = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    spg, ga = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (2, 2)
    # optional 6th argument, an advantage_baseline: the trainer computes the advantages of FIXED_REWARDS
    baseline = dict(rewards=FIXED_REWARDS, advantage_baseline=sys.argv[6], scale_rewards="none") if len(sys.argv) > 6 else {}
    results = {}
    for norm in norms:
        grads, rows, trainer = run_trainer(model_dir, norm, spg, ga, **baseline)
        results[norm] = {"grads": [strip_ddp_prefix(g) for g in grads], "rows": rows}
    if trainer.accelerator.is_main_process:
        results["num_processes"] = trainer.accelerator.num_processes
        torch.save(results, out_path)
