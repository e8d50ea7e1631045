"""`RLVRAsyncConfig`: TRL's `AsyncGRPOConfig` with the RLVR switches that mean something off-policy (docs/async.md).

Each switch shared with :class:`trl_rlvr.RLVRConfig` has its name, meaning and ``help`` text; the ones that do not
carry over to a trainer that scores each group alone and trains each rollout once are not here (docs/async.md lists
them and why). Added: the stale-rollout importance-sampling correction (``stale_is_*``,
:mod:`trl_rlvr.algorithms.stale_is`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trl.experimental.async_grpo import AsyncGRPOConfig

from trl_rlvr.algorithms.advantages import BASELINES, STD_KINDS
from trl_rlvr.algorithms.group_scores import GROUP_SCALES
from trl_rlvr.algorithms.packed_loss import NORMALIZATIONS
from trl_rlvr.algorithms.shaping import validate_overlong
from trl_rlvr.algorithms.stale_is import MODES, check_stale_is
from trl_rlvr.algorithms.stale_rows import syncs_read_to_loss
from trl_rlvr.checks.alarms import parse_thresholds
from trl_rlvr.config import RLVRConfig

_RLVR_FIELDS = {f.name: f for f in dataclasses.fields(RLVRConfig)}


def _as_in_rlvr_config(name: str, default=dataclasses.MISSING, **extra):
    """A field with ``RLVRConfig``'s help text for ``name`` (one text, written once), and ``default``."""
    metadata = {**_RLVR_FIELDS[name].metadata, **extra}
    if default is dataclasses.MISSING:
        default = _RLVR_FIELDS[name].default
    return field(default=default, metadata=metadata)


def _choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def _check_max_staleness(max_staleness: int, token_budget: int | None) -> None:
    """Refuse a ``max_staleness`` under which no row can ever be trained: a row read from the queue waits
    ``syncs_read_to_loss(token_budget)`` weight syncs at most before its loss, and the trainer admits a row only if
    it will be within ``max_staleness`` then (docs/async.md)."""
    gap = syncs_read_to_loss(token_budget)
    if max_staleness < gap:
        batching = "fixed-count batching (token_budget=0)" if gap == 1 else "token-budget batching (token_budget != 0)"
        raise ValueError(
            f"max_staleness={max_staleness} can never train: with {batching} a row read from the rollout queue may "
            f"wait {gap} weight sync(s) before its loss (accelerate fetches the next micro-batch before the step's "
            f"sync{'' if gap == 1 else '; the row that closes a token-budget micro-batch waits for the next one'}), "
            f"and a row over max_staleness at its loss is never trained; use max_staleness >= {gap}")


@dataclass
class RLVRAsyncConfig(AsyncGRPOConfig):
    """`AsyncGRPOConfig` with the RLVR switches; every field of `AsyncGRPOConfig` keeps its meaning.

    Loss: ``loss_normalization`` (default ``per_batch_token``, TRL's async divisor), ``loss_constant``; TRL's
    ``epsilon``/``epsilon_high`` (clip-higher). Stale rollouts: ``stale_is_mode`` (default ``token_truncate``),
    ``stale_is_clip_min``, ``stale_is_clip_max`` (default 3.0, TRL's synchronous ``vllm_importance_sampling_clip_max``).
    Rewards: ``reward_weights``, ``reward_options``, ``success_reward``, ``correctness_rewards``, ``overlong_buffer_length``,
    ``overlong_penalty_factor``. Advantages: ``scale_rewards`` (``group`` or ``none``), ``advantage_baseline``,
    ``advantage_std``. Dynamic sampling: ``dynamic_sampling``, ``dynamic_sampling_tolerance``. Metrics and alarms:
    ``success_threshold`` (``rlvr/accuracy``), ``alarms``, ``alarm_thresholds`` (:mod:`trl_rlvr.checks.alarms`, the
    ``stale_is`` alarm included).
    """

    loss_normalization: str = _as_in_rlvr_config("loss_normalization", "per_batch_token",
                                                 choices=list(NORMALIZATIONS))
    loss_constant: int | None = _as_in_rlvr_config("loss_constant")
    stale_is_mode: str | None = field(
        default="token_truncate",
        metadata={
            "help": "Importance-sampling correction of stale rollouts (trl_rlvr.algorithms.stale_is): the weight of "
            "each token's gradient is its ratio pi_theta / pi_vLLM truncated to [stale_is_clip_min, "
            "stale_is_clip_max] ('token_truncate', 'sequence_truncate': per completion), or zeroed outside it "
            "('token_mask', 'sequence_mask'); PPO's clip still decides which tokens move. None: TRL's loss, whose "
            "ratio is unbounded on the negative-advantage branch.",
            "choices": [None, *MODES],
        },
    )
    stale_is_clip_min: float | None = field(
        default=None, metadata={"help": "Lower bound C_min of the importance weight, in [0, 1]; None: no bound."}
    )
    stale_is_clip_max: float | None = field(
        default=3.0,
        metadata={"help": "Upper bound C_max of the importance weight, >= 1 (TRL's synchronous default, 3.0); every "
                          "token's gradient is at most C_max |A| |grad log pi|."},
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={"help": "Weights of the reward functions, in their order (GRPOConfig.reward_weights); None: 1 each."},
    )
    reward_options: dict | str | None = _as_in_rlvr_config("reward_options")
    success_reward: str | None = _as_in_rlvr_config("success_reward")
    correctness_rewards: list[str] | None = _as_in_rlvr_config("correctness_rewards")
    overlong_buffer_length: int | None = _as_in_rlvr_config("overlong_buffer_length")
    overlong_penalty_factor: float = _as_in_rlvr_config("overlong_penalty_factor")
    scale_rewards: str = field(
        default="group",
        metadata={"help": "Divide each group's centered rewards by its std ('group') or not ('none', Dr. GRPO). "
                          "'batch' does not exist here: a group is scored alone, before its batch exists.",
                  "choices": list(GROUP_SCALES)},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO's dynamic sampling in the rollout process: a group whose scored rewards do not differ "
                          "(by more than dynamic_sampling_tolerance) is dropped before it is queued, and the next "
                          "prompt is generated in its place; counted in rlvr/ds_dropped_groups_total."},
    )
    dynamic_sampling_tolerance: float = _as_in_rlvr_config("dynamic_sampling_tolerance")
    advantage_baseline: str = _as_in_rlvr_config("advantage_baseline")
    advantage_std: str = _as_in_rlvr_config("advantage_std")
    success_threshold: float = _as_in_rlvr_config("success_threshold")
    alarms: bool = field(
        default=True,
        metadata={"help": "The alarms of RLVRTrainer (trl_rlvr.checks.alarms: truncation, unreadable answers, reward "
                          "failures, zero-signal groups) and the stale_is alarm: the importance weights' effective "
                          "sample size below stale_is_ess_frac, or the log-ratio's spread above "
                          "stale_is_log_ratio_std, for patience logging steps. Each warns once and is logged as "
                          "rlvr/alarm/<name>."},
    )
    alarm_thresholds: dict | str | None = field(
        default=None,
        metadata={"help": "Overrides of the alarms' thresholds (RLVRConfig.alarm_thresholds), with "
                          "stale_is_ess_frac (0.5) and stale_is_log_ratio_std (0.83 nats = sqrt(ln 2): the same "
                          "bound for a log-normal ratio; not calibrated on a run)."},
    )

    def __post_init__(self):
        if isinstance(self.reward_options, str):
            import json

            try:
                self.reward_options = json.loads(self.reward_options)
            except json.JSONDecodeError as err:
                raise ValueError(f"reward_options must be a JSON object mapping plugin name -> options: {err}") from err
        super().__post_init__()
        self._validate()

    def _validate(self) -> None:
        _choice("loss_normalization", self.loss_normalization, NORMALIZATIONS)
        if self.loss_normalization == "constant" and self.loss_constant is None:
            self.loss_constant = self.max_completion_length  # Dr. GRPO's C: the generation budget
        if self.loss_constant is not None and not self.loss_constant > 0:
            raise ValueError(f"loss_constant must be positive, got {self.loss_constant!r}")
        check_stale_is(self.stale_is_mode, self.stale_is_clip_min, self.stale_is_clip_max)
        _check_max_staleness(self.max_staleness, self.token_budget)
        _choice("scale_rewards", self.scale_rewards, GROUP_SCALES)
        _choice("advantage_baseline", self.advantage_baseline, BASELINES)
        _choice("advantage_std", self.advantage_std, STD_KINDS)
        if not self.dynamic_sampling_tolerance >= 0:
            raise ValueError(f"dynamic_sampling_tolerance must be >= 0, got {self.dynamic_sampling_tolerance!r}")
        if self.overlong_buffer_length is not None:
            validate_overlong(self.max_completion_length, self.overlong_buffer_length, self.overlong_penalty_factor)
        self.alarm_thresholds = parse_thresholds(self.alarm_thresholds)  # every key, validated
