"""Sampled evaluation during training: ``eval/pass@1``, ``eval/pass@k``, ``eval/maj@k`` every ``eval_steps``.

    trainer.add_callback(SampledEvalCallback(trainer, eval_dataset, success_reward="boxed_math", n=8, eval_steps=50))

TRL's own eval loop (``eval_strategy``) logs mean rewards, not pass@k, so this is a callback. After every
``eval_steps``-th optimizer step (and, with ``at_start``, before the first) it runs
:func:`trl_rlvr.evaluation.evaluate.evaluate_sampled` on the trainer's model with the trainer's accelerator (every process
samples a share; ZeRO-3 / FSDP parameters are gathered for generation) and logs the results through
``transformers.Trainer.log``, so they reach every ``report_to`` integration and ``state.log_history``. (It calls
the base ``Trainer.log``, not GRPOTrainer's, which would take and clear the pending training metrics; and it
keeps the step's ``should_log``, which logging resets.)

With ``metric_for_best_model="eval/pass@1"`` (any logged key) and ``load_best_model_at_end=True`` its evaluations
choose the best checkpoint (:mod:`trl_rlvr.evaluation.best_model`).
"""

from __future__ import annotations

from transformers import Trainer, TrainerCallback

from trl_rlvr.evaluation.metric_table import TOOL_METRICS, log_keys, log_metrics

#: the tool metrics logged as ``eval/tools/<key>`` (:data:`trl_rlvr.evaluation.metric_table.TOOL_METRICS`)
TOOL_KEYS = tuple(metric.key for metric in TOOL_METRICS)


class SampledEvalCallback(TrainerCallback):
    """Logs sampled pass@k / maj@k of ``dataset`` (rows with ``prompt`` and the reward's reference columns).

    Args:
        trainer: the (RLVR/GRPO) trainer the callback is added to.
        dataset: held-out rows.
        success_reward: which of the trainer's reward functions decides right/wrong (its name, as in
            ``trainer.reward_func_names``; default: the trainer's ``args.success_reward``, else the first).
        format_reward: a reward name whose score >= 1 counts as formatted (``eval/format_rate``), or None.
        n, ks, temperature, top_p, max_new_tokens, batch_size, seed: as :func:`evaluate_sampled`
            (``max_new_tokens`` default: the trainer's ``max_completion_length``; ``temperature``: its temperature).
        eval_steps: evaluate every this many optimizer steps (default: ``args.eval_steps``).
        at_start: also evaluate before the first step (logged at step 0).
        generator: ``"hf"`` (default): HF ``generate`` on the training model; ``"vllm"``: the trainer's vLLM, its
            weights synced first as TRL syncs them once per step: its colocated engine (``vllm_mode="colocate"``) or
            its server (``vllm_mode="server"``: the requests go to the server through TRL's client,
            :mod:`trl_rlvr.evaluation.vllm_served`). Each sample is seeded from ``(seed, question, sample)`` on
            both; the samples differ between HF and vLLM (:mod:`trl_rlvr.evaluation.vllm_generation`).
        environment_factory: tool rollouts (:mod:`trl_rlvr.evaluation.tool_rollouts`): ``"trainer"`` (default) takes
            the trainer's own ``environment_factory`` when it has one (one callable; its chat template and
            ``max_tool_calling_iterations`` too), ``None`` evaluates without tools, or a callable; on either generator.
            Logs ``eval/tools/...`` besides.
    """

    def __init__(self, trainer, dataset, *, success_reward: str | None = None, format_reward: str | None = None,
                 n: int = 8, ks: list[int] | None = None, temperature: float | None = None, top_p: float = 1.0,
                 max_new_tokens: int | None = None, batch_size: int = 64, seed: int = 0,
                 eval_steps: int | None = None, at_start: bool = False, generator: str = "hf",
                 environment_factory="trainer"):
        from trl_rlvr.evaluation.evaluate import resolve_ks

        args = trainer.args
        self.trainer = trainer
        self.dataset = dataset
        names = list(trainer.reward_func_names)
        success_reward = success_reward or getattr(args, "success_reward", None) or names[0]
        for label, name in (("success_reward", success_reward), ("format_reward", format_reward)):
            if name is not None and name not in names:
                raise ValueError(f"SampledEvalCallback: {label} {name!r} is not one of the trainer's rewards {names}")
        self.success_fn = trainer.reward_funcs[names.index(success_reward)]
        self.format_fn = trainer.reward_funcs[names.index(format_reward)] if format_reward else None
        self.eval_steps = eval_steps or args.eval_steps
        if not self.eval_steps or self.eval_steps < 1 or self.eval_steps != int(self.eval_steps):
            raise ValueError(f"SampledEvalCallback: eval_steps must be a positive integer, got {self.eval_steps!r}")
        self.eval_steps = int(self.eval_steps)
        self.ks = resolve_ks(n, ks)
        self.at_start = at_start
        if generator not in ("hf", "vllm"):
            raise ValueError(f"SampledEvalCallback: generator must be 'hf' or 'vllm', got {generator!r}")
        self.generator = generator
        tools = {}
        if environment_factory == "trainer":
            factories = getattr(trainer, "environment_factories", None) or {}
            if len(factories) > 1:
                raise ValueError("SampledEvalCallback: the trainer has several environments; pass "
                                 "environment_factory= (one callable) or None")
            environment_factory = next(iter(factories.values()), None)
        if environment_factory is not None:
            tools = dict(environment_factory=environment_factory, chat_template=getattr(trainer, "chat_template", None),
                         max_tool_calling_iterations=getattr(args, "max_tool_calling_iterations", None))
        self.environment_factory = environment_factory
        if generator == "vllm":
            from trl_rlvr.evaluation.vllm_generation import check_trainer_vllm

            check_trainer_vllm(trainer)
        self.kwargs = dict(
            **tools,
            n=n, ks=self.ks, temperature=temperature if temperature is not None else args.temperature, top_p=top_p,
            max_new_tokens=max_new_tokens or args.max_completion_length, batch_size=batch_size, seed=seed,
            success_threshold=getattr(args, "success_threshold", 1.0),
        )
        self.history: list[dict] = []
        from trl_rlvr.evaluation.best_model import sampled_best_metric

        self.best_model_metric = sampled_best_metric(args, self.eval_steps, self.keys())  # metric_for_best_model

    def keys(self) -> list[str]:
        """Every key :meth:`metrics` may log (:data:`trl_rlvr.evaluation.metric_table.EVAL_METRICS`' log keys)."""
        return log_keys(self.ks, tools=self.environment_factory is not None)

    def metrics(self, result: dict) -> dict:
        """The logged keys: eval/pass@k for each k (pass@1 = mean@n), eval/maj@k, format, lengths, truncation
        (:func:`trl_rlvr.evaluation.metric_table.log_metrics`)."""
        return log_metrics(result, self.ks)

    def evaluate(self, state) -> dict:
        from trl_rlvr.evaluation.evaluate import evaluate_sampled

        t = self.trainer
        llm = None
        if self.generator == "vllm":
            from trl_rlvr.evaluation.vllm_generation import trainer_vllm_engine

            llm = trainer_vllm_engine(t)
        model = t.model_wrapped if llm is None else t.model  # with vLLM, the model only lends its EOS tokens
        result = evaluate_sampled(model, t.processing_class, self.dataset, self.success_fn, self.format_fn,
                                  accelerator=t.accelerator, llm=llm, **self.kwargs)
        logs = self.metrics(result)
        self.history.append({"step": state.global_step, **logs})
        Trainer.log(t, logs)
        return result

    def on_train_begin(self, args, state, control, **kwargs):
        if self.at_start and state.global_step == 0:
            self.evaluate(state)

    def on_step_end(self, args, state, control, **kwargs):
        if self.best_model_metric is not None:
            control.should_evaluate = False  # this evaluation, not the trainer's, feeds best-model selection
        if state.global_step > 0 and state.global_step % self.eval_steps == 0:
            should_log = control.should_log
            self.evaluate(state)
            control.should_log = should_log  # logging resets it: the step's own training log must still happen
            if self.best_model_metric is not None:
                from trl_rlvr.evaluation.best_model import offer_to_best_model_selection

                offer_to_best_model_selection(self.trainer, control, self.history[-1])
        return control
