"""Named presets: the algorithm switches of one paper, as ``RLVRConfig`` field values.

``RLVRConfig.from_preset("dapo", **overrides)`` in Python, ``preset: dapo`` in a recipe (``trl-rlvr train``).
A preset is GRPO's switches (:data:`BASE`) and the paper's differences from them;
every preset sets the same fields (:data:`PRESET_FIELDS`), so choosing one fixes the whole algorithm whatever
the other fields say; model, data, batch sizes, lengths and learning rate stay the user's. The papers' own
hyperparameters for those are listed in docs/recipes.md beside this table, not set here.

A value that a paper gives as a share of its budget (DAPO's overlong buffer, 4096 of 20480 tokens) is a
function of the run's settings: the user's ``max_completion_length``, or, left unset, ``GRPOConfig``'s default
as the installed TRL declares it. A ``loss_type`` the user sets replaces the preset's ``loss_normalization``
(the two fields are one choice).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    """One paper's switches: ``differences`` from :data:`BASE` (field -> value, or a function of the other settings:
    the DAPO overlong buffer scales with the budget); ``values`` is the whole set, every field of :data:`BASE`."""

    paper: str
    differences: Mapping[str, Any | Callable[[Mapping[str, Any]], Any]]

    def __post_init__(self):
        unknown = sorted(set(self.differences) - set(BASE))
        if unknown:
            raise ValueError(f"a preset sets {unknown}, which are not preset fields (BASE): {sorted(BASE)}")

    @property
    def values(self) -> dict[str, Any | Callable[[Mapping[str, Any]], Any]]:
        return {**BASE, **self.differences}


def setting(settings: Mapping[str, Any], name: str) -> Any:
    """``name`` as the run will have it: ``settings[name]`` when set (not None), else the default the installed
    TRL's ``GRPOConfig`` declares for it."""
    if settings.get(name) is not None:
        return settings[name]
    from trl import GRPOConfig

    default = GRPOConfig.__dataclass_fields__[name].default
    if default is MISSING:
        raise ValueError(f"a preset reads {name!r}, which GRPOConfig gives no default; set it")
    return default


def _dapo_overlong_buffer(settings: Mapping[str, Any]) -> int:
    """DAPO's soft-punishment buffer, 4096 tokens of a 20480-token budget: one fifth of max_completion_length."""
    return int(setting(settings, "max_completion_length")) // 5


#: Every field a preset sets, at GRPO's values (Shao et al. 2024): the base every paper's preset differs from. A
#: preset sets each of these (its own value or the base's), so choosing one fixes the whole algorithm.
BASE: dict[str, Any] = dict(
    loss_normalization="per_answer", scale_rewards="group", advantage_std="population", advantage_baseline="group_mean",
    beta=0.04, epsilon=0.2, epsilon_high=None, mask_truncated_completions=False,
    dynamic_sampling=False, max_sampling_rounds=3, dynamic_sampling_metric="reward",
    overlong_buffer_length=None, overlong_penalty_factor=1.0,
)
#: The fields a preset may set, listed once (the keys of :data:`BASE`).
PRESET_FIELDS = tuple(BASE)

#: name -> (paper, the values where it differs from :data:`BASE`)
PRESETS: dict[str, Preset] = {
    "grpo": Preset(
        "Shao et al. 2024, DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models "
        "(arXiv:2402.03300)",
        {},
    ),
    "r1zero": Preset(
        "DeepSeek-AI 2025, DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement Learning "
        "(arXiv:2501.12948; Nature 645, 2025)",
        dict(beta=0.001),
    ),
    "dr_grpo": Preset(
        "Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective (arXiv:2503.20783)",
        dict(loss_normalization="constant", scale_rewards="none", beta=0.0),
    ),
    "dapo": Preset(
        "Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale (arXiv:2503.14476)",
        dict(loss_normalization="per_batch_token", beta=0.0, epsilon_high=0.28, dynamic_sampling=True,
             max_sampling_rounds=10, dynamic_sampling_metric="success", overlong_buffer_length=_dapo_overlong_buffer),
    ),
}


#: The run settings both committed example runs share (examples/r1zero.py, examples/tool_r1.py: SmolLM2-135M on a
#: 2-core CPU, docs/benchmarks.md): DAPO's loss with clip-higher and two-round dynamic sampling, no KL term, 16 answers
#: per step in 8 micro-batches, a constant learning rate, float32, every step logged, nothing saved. An example
#: starts from these and names only what it changes (its budget, its learning rate, its output folder).
SMALL_MODEL_ON_CPU: dict[str, Any] = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=8, num_generations=8,  # 2 questions x 8 per step
    lr_scheduler_type="constant", warmup_steps=0, temperature=1.0,
    beta=0.0,  # no KL term, no reference model (R1-Zero / DAPO)
    loss_normalization="per_batch_token", epsilon=0.2, epsilon_high=0.28,  # DAPO's token-level loss, clip-higher
    dynamic_sampling=True, max_sampling_rounds=2, overlong_penalty_factor=1.0, success_reward="boxed_math",
    logging_steps=1, save_strategy="no", report_to="none", seed=42, dtype="float32",
)


#: The first main job's settings (examples/r1zero.py's parser defaults): what made SmolLM2-135M learn the format on a
#: 2-core CPU (the run: docs/benchmarks.md). A YAML file (--config) or the command line overrides any of them.
R1ZERO_ON_CPU: dict[str, Any] = dict(
    SMALL_MODEL_ON_CPU,
    output_dir="outputs/r1zero",
    max_steps=9,
    max_completion_length=64,
    learning_rate=3e-5,
    overlong_buffer_length=16,  # penalty from 48 tokens, -1 at 64
    activation_checkpointing=False,
    num_train_samples=256,
)


def on_this_machine(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` as a job's defaults on this machine: without CUDA, float32 on the CPU (``bf16`` and ``fp16``
    off: bf16 is slower than fp32 on a CPU, docs/benchmarks.md; ``use_cpu``)."""
    import torch

    settings = dict(settings)
    if not torch.cuda.is_available():
        settings.update(bf16=False, fp16=False, use_cpu=True)
    return settings


def preset_values(name: str, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The field values of preset ``name``; those that depend on other fields read them from ``settings``.

    Raises ``ValueError`` naming ``name`` and the presets there are."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; presets: {', '.join(map(repr, PRESETS))}")
    settings = settings or {}
    values = {k: v(settings) if callable(v) else v for k, v in PRESETS[name].values.items()}
    if settings.get("loss_type") is not None and settings.get("loss_normalization") is None:
        del values["loss_normalization"]  # the user's loss_type is their choice of normalization
    return values
