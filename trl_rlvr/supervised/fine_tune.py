"""Supervised fine-tuning on conversations with TRL's ``SFTTrainer``, assistant-only loss: the one SFT step of the
tool job's cold start (:func:`trl_rlvr.tasks.tool_arithmetic.cold_start`) and of rejection-sampling fine-tuning
(:mod:`trl_rlvr.supervised.rejection_sampling`).

A row is a conversation (``messages``: only the assistant turns carry loss; tool replies and prompts do not: the
chat template's ``{% generation %}`` marks, TRL's ``assistant_only_loss``) or a prompt-completion pair of strings
(``prompt``, ``completion``: the completion carries the loss, TRL's ``completion_only_loss``). With ``tools`` (JSON
schemas) each row is rendered with them, as TRL's multi-turn loop renders the prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: The columns the SFT step reads; a dataset's other columns (an RFT dataset's question, answer, score) are left out.
SFT_COLUMNS = ("messages", "prompt", "completion", "tools")


@dataclass
class SFTSettings:
    """The SFT step's settings (the cold start's options, ``sft_*``). ``batch_size`` rows per optimizer step, made of
    ``batch_size // micro_batch_size`` accumulated forward passes of ``micro_batch_size`` rows; a constant learning
    rate, no warm-up."""

    epochs: float = 2.0
    learning_rate: float = 5e-5
    batch_size: int = 8
    micro_batch_size: int = 2
    max_length: int = 512
    seed: int = 42
    use_cpu: bool = False
    bf16: bool = False
    model_init_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.micro_batch_size < 1 or self.batch_size % self.micro_batch_size:
            raise ValueError(f"SFT batch_size={self.batch_size} must be a multiple of micro_batch_size="
                             f"{self.micro_batch_size} (>= 1)")
        if self.epochs <= 0 or self.learning_rate <= 0:
            raise ValueError(f"SFT epochs ({self.epochs}) and learning_rate ({self.learning_rate}) must be > 0")

    def config(self, output_dir, conversational: bool = True):
        """TRL's ``SFTConfig`` of these settings (assistant-only loss for conversations; for prompt-completion text,
        TRL's completion-only loss), no checkpoints, a line per step."""
        from trl import SFTConfig

        return SFTConfig(
            output_dir=str(output_dir), num_train_epochs=self.epochs, learning_rate=self.learning_rate,
            per_device_train_batch_size=self.micro_batch_size, lr_scheduler_type="constant", warmup_steps=0,
            gradient_accumulation_steps=self.batch_size // self.micro_batch_size,
            assistant_only_loss=conversational, max_length=self.max_length, logging_steps=1, save_strategy="no",
            report_to="none", seed=self.seed, use_cpu=self.use_cpu, bf16=self.bf16,
            model_init_kwargs=dict(self.model_init_kwargs), disable_tqdm=True,
        )


def sft_dataset(rows, tools: list | None = None):
    """A ``datasets.Dataset`` of the SFT columns of ``rows`` (dicts, or a dataset), each with ``tools`` as a JSON
    string when given (TRL renders it with the chat template). ``ValueError`` naming what is missing."""
    from datasets import Dataset

    rows = list(rows)
    if not rows:
        raise ValueError("SFT: no rows to train on")
    kept = []
    for i, row in enumerate(rows):
        if "messages" not in row and not ("prompt" in row and "completion" in row):
            raise ValueError(f"SFT: row {i} has neither 'messages' nor 'prompt' and 'completion' (columns: "
                             f"{sorted(row)})")
        out = {k: row[k] for k in SFT_COLUMNS if k in row and k != "tools"}
        if tools is not None:
            out["tools"] = json.dumps(tools)
        elif row.get("tools") is not None:
            out["tools"] = row["tools"] if isinstance(row["tools"], str) else json.dumps(row["tools"])
        kept.append(out)
    return Dataset.from_list(kept)


def sft_lines_callback(label: str = "cold start"):
    from transformers import TrainerCallback

    class SFTLines(TrainerCallback):
        """One line per SFT step (its loss), on the main process: ``<label> step i/n: loss x``."""

        def on_log(self, args, state, control, logs=None, **kw):
            if state.is_world_process_zero and logs and "loss" in logs:
                print(f"{label} step {state.global_step}/{state.max_steps}: loss {logs['loss']:.3f}", flush=True)

    return SFTLines()


def supervised_fine_tune(model_path, tokenizer, rows, out_dir, settings: SFTSettings, tools: list | None = None,
                         label: str = "cold start") -> list[dict]:
    """SFT of the model at ``model_path`` on ``rows`` (:func:`sft_dataset`) with ``settings``, a line per step
    (``label``); the model and ``tokenizer`` saved to ``out_dir``. Returns the log history of the steps (``loss``
    per step)."""
    from trl import SFTTrainer

    data = sft_dataset(rows, tools)
    trainer = SFTTrainer(model=str(model_path), args=settings.config(out_dir, "messages" in data.column_names),
                         train_dataset=data, processing_class=tokenizer)
    trainer.add_callback(sft_lines_callback(label))
    trainer.train()
    trainer.save_model(str(out_dir))  # the main process writes; the others wait below before loading it
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(str(out_dir))
    trainer.accelerator.wait_for_everyone()
    history = [h for h in trainer.state.log_history if "loss" in h]
    del trainer
    return history
