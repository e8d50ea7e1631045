"""`RLVRTrainer`: TRL's `GRPOTrainer` with the RLVR switches of `RLVRConfig`, as thin glue.

What is TRL's and what is ours:

- the PPO-clip token loss, clip-higher (``epsilon``/``epsilon_high``) and ``mask_truncated_completions`` are
  TRL's code, used as is (tests hold them to independent references);
- the group advantages are recomputed with the population std of the GRPO paper
  (:func:`trl_rlvr.advantages.group_advantages`): TRL 1.16 divides by the sample std (Bessel), 0.87x at G=4;
- ``loss_normalization`` selects TRL's ``loss_type``; for ``per_batch_token`` we give every micro-batch the exact
  token count of its optimizer step (:func:`trl_rlvr.losses.per_step_num_items`); for ``constant`` we let
  ``loss_constant`` replace ``max_completion_length`` as Dr. GRPO's divisor;
- reward functions may be registry names (``reward_funcs=["boxed_math", "think_format"]``);
- DAPO's soft overlong penalty is the ``overlong`` reward plugin, appended with weight 1 (so it is added to the
  reward before the group baseline and logged as ``rewards/overlong/mean``);
- the ``rlvr/`` diagnostics (:mod:`trl_rlvr.metrics`) are computed from the gathered rewards of each batch.
"""

from __future__ import annotations

import contextlib

import torch
from trl import GRPOTrainer

from .advantages import group_advantages
from .config import RLVRConfig
from .losses import per_step_num_items
from .metrics import rollout_metrics

#: TRL metric -> the rlvr/ name it is re-published under.
_TRL_METRIC_ALIASES = {"clip_ratio/low_mean": "rlvr/clip_low_frac", "clip_ratio/high_mean": "rlvr/clip_high_frac"}


class RLVRTrainer(GRPOTrainer):
    """Drop-in `GRPOTrainer` for RLVR; see :class:`trl_rlvr.RLVRConfig` for the switches.

    Anything that runs with ``GRPOTrainer`` runs with ``RLVRTrainer`` unchanged. In addition, entries of
    ``reward_funcs`` may name reward plugins of the ``trl_rlvr.rewards`` entry-point group; their options come
    from ``args.reward_options``.
    """

    _tag_names = ["trl", "grpo", "trl-rlvr"]

    def __init__(self, model, reward_funcs=None, args: RLVRConfig | None = None, *pos, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = RLVRConfig(f"{str(name).rstrip('/').split('/')[-1]}-RLVR")
        elif not isinstance(args, RLVRConfig):
            raise TypeError(f"RLVRTrainer needs args of type RLVRConfig, got {type(args).__name__}")
        reward_funcs = self._resolve_reward_funcs(reward_funcs, args)
        super().__init__(model, reward_funcs, args, *pos, **kwargs)
        self._success_index = self._find_success_reward(args.success_reward)

    # -- construction -------------------------------------------------------------------------------------------

    @staticmethod
    def _resolve_reward_funcs(reward_funcs, args: RLVRConfig):
        """Registry names -> plugins; append the overlong penalty when ``overlong_buffer_length`` is set."""
        if reward_funcs is None:
            funcs = []
        elif isinstance(reward_funcs, (list, tuple)):
            funcs = list(reward_funcs)
        else:
            funcs = [reward_funcs]
        if any(isinstance(f, str) for f in funcs) or args.overlong_buffer_length is not None:
            from .rewards import load_reward, resolve_reward_funcs

            funcs = resolve_reward_funcs(funcs, args.reward_options)
            if args.overlong_buffer_length is not None:
                funcs.append(
                    load_reward(
                        "overlong",
                        max_completion_length=args.max_completion_length,
                        buffer_length=args.overlong_buffer_length,
                        penalty_factor=args.overlong_penalty_factor,
                    )
                )
                if args.reward_weights is not None:
                    args.reward_weights = [*args.reward_weights, 1.0]
        return funcs if funcs or reward_funcs is not None else None

    def _find_success_reward(self, name: str | None) -> int | None:
        if not self.reward_func_names:
            return None
        if name is None:
            return 0
        if name not in self.reward_func_names:
            raise ValueError(f"success_reward={name!r} is not a reward function here; known: {self.reward_func_names}")
        return self.reward_func_names.index(name)

    # -- rewards and diagnostics --------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._batch_rewards = self._total_rewards(rewards_per_func)
        self._log_rollout_metrics(rewards_per_func, completion_ids_list)
        return rewards_per_func

    def _total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Weighted sum over reward functions, NaN where no function scored the answer (as TRL does)."""
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.multi_objective_aggregation == "sum_then_normalize":  # else TRL's own scheme is kept
            mode = "train" if self.model.training else "eval"
            group_size = self.num_generations if mode == "train" else self.num_generations_eval
            advantages = group_advantages(self._batch_rewards, group_size, self.scale_rewards)
            rows = len(output["advantages"])
            start = self.accelerator.process_index * rows
            output["advantages"] = advantages[start : start + rows].to(output["advantages"].dtype)
        return output

    def _log_rollout_metrics(self, rewards_per_func: torch.Tensor, completion_ids_list) -> None:
        """Gather lengths and truncation flags (the rewards are already global) and log the rlvr/ diagnostics."""
        if self._success_index is None:
            return
        device = rewards_per_func.device
        mode = "train" if self.model.training else "eval"
        stop_ids = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        local = torch.tensor(
            [[len(ids), float(bool(ids) and ids[-1] not in stop_ids)] for ids in completion_ids_list],
            dtype=torch.float32,
            device=device,
        )
        lengths, truncated = self.accelerator.gather(local).unbind(dim=1)
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        metrics = rollout_metrics(
            self._batch_rewards,
            rewards_per_func[:, self._success_index],
            lengths,
            truncated.bool(),
            group_size,
            success_threshold=self.args.success_threshold,
            tolerance=self.args.dynamic_sampling_tolerance,
        )
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        for trl_name, rlvr_name in _TRL_METRIC_ALIASES.items():
            if trl_name in self._metrics[mode]:
                self._metrics[mode][rlvr_name] = list(self._metrics[mode][trl_name])
        super().log(logs, start_time)

    # -- loss normalisation -------------------------------------------------------------------------------------

    def _prepare_inputs(self, generation_batch):
        buffered_before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if (
            self.model.training
            and self._buffered_inputs is not buffered_before
            and self.args.loss_normalization == "per_batch_token"
            and self.args.steps_per_generation % self.args.gradient_accumulation_steps == 0
        ):
            self._set_exact_token_counts(self._buffered_inputs)
        return inputs

    def _set_exact_token_counts(self, micro_batches: list[dict]) -> None:
        """Give each buffered micro-batch the token count of its optimizer step's global batch (DAPO, exact)."""
        local = torch.stack([_loss_mask(batch).sum() for batch in micro_batches]).float()
        global_counts = self.accelerator.reduce(local, reduction="sum")
        for batch, num_items in zip(
            micro_batches, per_step_num_items(global_counts, self.args.gradient_accumulation_steps), strict=True
        ):
            batch["num_items_in_batch"] = num_items

    def _compute_loss(self, model, inputs):
        if self.args.loss_normalization != "constant" or self.args.loss_constant is None:
            return super()._compute_loss(model, inputs)
        # TRL's dr_grpo divides by (rows x max_completion_length); Dr. GRPO's constant may be set apart from it.
        with _swapped(self, "max_completion_length", self.args.loss_constant):
            return super()._compute_loss(model, inputs)


def _loss_mask(batch: dict) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


@contextlib.contextmanager
def _swapped(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)
