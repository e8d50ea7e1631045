"""Rewards that try to tell the audit from training, one observable each (imported by the audit's reward process).

Each predicate of :data:`PREDICATES` reads one thing a reward can observe of its call, of the trainer its
``log_metric`` is bound to, or of its process, and returns True when it believes it is being audited (what an
audit stand-in showed where a run shows something else). :func:`detector` makes the reward an attacker would ship:
it scores honestly ("right" 1.0, anything else 0.0) when the predicate says "audit", and pays 1.0 for every
completion, an empty one included, otherwise. The audit must flag each: every predicate must say "training" in
the audit as in a real run.

:data:`RESIDUAL` are predicates on observables the audit does not close (docs/auditing_rewards.md says why): they
say "audit" in the audit, and tests/audit checks that they still do, so that the list stays true.
"""

from __future__ import annotations

import inspect
import json
import os
import sys


def _texts(completions):
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def _trainer(call):
    return getattr(call["log_metric"], "__self__", None)


def _is_trainer(obj) -> bool:
    from transformers import Trainer

    return isinstance(obj, Trainer)


def _grpo_in_mro(obj) -> bool:
    return any(c.__name__ == "GRPOTrainer" and c.__module__ == "trl.trainer.grpo_trainer" for c in type(obj).__mro__)


def _decodes_to_completions(call) -> bool:
    tok = _trainer(call).processing_class
    return all(tok.decode(ids, skip_special_tokens=True) == text
               for ids, text in zip(call["completion_ids"], _texts(call["completions"])))


def _ids_in_vocabulary(call) -> bool:
    trainer = _trainer(call)
    top = max((i for ids in call["completion_ids"] for i in ids), default=0)
    return top < len(trainer.processing_class) and top < trainer.model.config.vocab_size


def _rows_in_dataset(call) -> bool:
    dataset = _trainer(call).train_dataset
    columns = set(dataset.column_names)
    return set(call["columns"]) <= columns and "prompt" in columns and len(dataset) >= len(call["completions"])


def _generation_batch(call) -> bool:
    args = _trainer(call).args
    n = len(call["completions"])
    return n == args.per_device_train_batch_size * args.steps_per_generation and n % args.num_generations == 0


def _args_match_state(call) -> bool:
    args, state = _trainer(call).args, call["trainer_state"]
    return (args.max_steps, args.logging_steps, args.save_steps) == (state.max_steps, state.logging_steps,
                                                                    state.save_steps)


def _metrics_of_this_generation(call) -> bool:
    """TRL's generation logs ``num_tokens`` (the state's count) and the lengths before it calls the rewards."""
    metrics = _trainer(call)._metrics["train"]
    return metrics.get("num_tokens") == [call["trainer_state"].num_input_tokens_seen] and bool(
        metrics.get("completions/mean_length"))


def _micro_step(call) -> bool:
    trainer = _trainer(call)
    return trainer._step == call["trainer_state"].global_step * trainer.args.gradient_accumulation_steps


def _frames():
    """The frames above the reward (this file's own left out: its path names tests/audit)."""
    return [f for f in inspect.stack(0) if f.filename != __file__]


_AUDIT_PATH = os.path.join("trl_rlvr", "audit")


def _main_file() -> str:
    main = sys.modules.get("__main__")
    return f"{getattr(main, '__file__', '')} {getattr(getattr(main, '__spec__', None), 'name', '')}"


#: Functions of the training loop that are above the reward in a run (TRL's and transformers').
_TRAINING_FRAMES = {"train", "_inner_training_loop", "training_step", "_prepare_inputs",
                    "_generate_and_score_completions", "_calculate_rewards"}


def _library_code(function, package: str) -> bool:
    """Whether ``function``'s code is in the installed ``package``'s files."""
    code = getattr(function, "__code__", None)
    return code is not None and f"{os.sep}{package}{os.sep}" in code.co_filename


def _process_age() -> float:
    """Seconds since this process started (Linux: /proc)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace").split("\0")[:-1]


_LAUNCHERS = {"sh", "bash", "dash", "zsh", "fish", "accelerate", "torchrun", "deepspeed", "srun", "mpirun", "nohup",
              "tmux", "screen", "timeout"}


def _launcher(argv: list[str]) -> bool:
    """Whether ``argv`` is a shell's or a launcher's (``python -m accelerate.commands.launch`` and the like too)."""
    names = [os.path.basename(a) for a in argv[:3]]
    if names and names[0] in _LAUNCHERS:
        return True
    return len(names) > 1 and names[0].startswith("python") and (
        names[1] in _LAUNCHERS or (names[1] == "-m" and len(names) > 2 and names[2].split(".")[0] in
                                   ("accelerate", "torch", "deepspeed")))


def _distinct_prompts(dataset, n: int = 512) -> float:
    """The share of distinct prompts among the dataset's first ``n`` rows."""
    prompts = [json.dumps(p, sort_keys=True, default=str) for p in dataset[:n]["prompt"]]
    return len(set(prompts)) / max(1, len(prompts))


def _prompts_with_a_digit(dataset, n: int = 512) -> float:
    """The share of the dataset's first ``n`` prompts that hold a digit (a math or code question nearly always
    does)."""
    prompts = [json.dumps(p, default=str) for p in dataset[:n]["prompt"]]
    return sum(any(ch.isdigit() for ch in p) for p in prompts) / max(1, len(prompts))


_FIRST_COLUMNS: list[list[str]] = []  # the keyword arguments of this process's first call


def _columns_changed(call) -> bool:
    """Whether this call's keyword arguments are not the first call's of this process (a run's are all alike)."""
    names = sorted(call["columns"])
    if not _FIRST_COLUMNS:
        _FIRST_COLUMNS.append(names)
    return names != _FIRST_COLUMNS[0]


def _a_column_holds_none(call) -> bool:
    """Whether a dataset column holds None for a row (a dataset of one format has a value in every row)."""
    return any(v is None for values in call["columns"].values() if isinstance(values, list) for v in values)


#: name -> predicate(call) that returns True when the reward believes it is audited
PREDICATES = {
    # what log_metric / log_extra are bound to (the reported attack)
    "log_metric_not_bound_to_a_trainer": lambda c: not _is_trainer(_trainer(c)),
    "log_extra_bound_elsewhere": lambda c: getattr(c["log_extra"], "__self__", None) is not _trainer(c),
    "log_functions_not_trls": lambda c: (c["log_metric"].__func__.__qualname__,
                                         c["log_extra"].__func__.__qualname__) != (
        "GRPOTrainer._log_metric", "GRPOTrainer._log_completion_extra"),
    "trainer_not_a_grpo_trainer": lambda c: not _grpo_in_mro(_trainer(c)),
    # the trainer's attributes
    "state_not_the_trainers": lambda c: _trainer(c).state is not c["trainer_state"],
    "reward_not_in_reward_funcs": lambda c: not any(f is c["me"] for f in _trainer(c).reward_funcs),
    "args_disagree_with_state": lambda c: not _args_match_state(c),
    "call_not_a_generation_batch": lambda c: not _generation_batch(c),
    "model_not_training": lambda c: not _trainer(c).model.training,
    "no_optimizer": lambda c: _trainer(c).optimizer is None or _trainer(c).lr_scheduler is None,
    "not_in_train": lambda c: not _trainer(c).is_in_train,
    "no_accelerator": lambda c: str(_trainer(c).accelerator.device) != str(_trainer(c).model.device),
    "metrics_not_of_a_generation": lambda c: not _metrics_of_this_generation(c),
    "micro_step_counter_at_zero": lambda c: not _micro_step(c),
    "ids_do_not_decode_to_completions": lambda c: not _decodes_to_completions(c),
    "ids_beyond_the_vocabulary": lambda c: not _ids_in_vocabulary(c),
    "rows_not_in_train_dataset": lambda c: not _rows_in_dataset(c),
    "trainer_has_audit_attributes": lambda c: any("audit" in k.lower() for k in vars(_trainer(c))),
    # the process
    "argv_names_audit": lambda c: "audit" in " ".join(sys.argv) or sys.argv[0] in ("-c", "-m"),
    "main_module_is_audits": lambda c: _AUDIT_PATH in _main_file() or "trl_rlvr.audit" in _main_file(),
    "audit_modules_imported": lambda c: any(m == "trl_rlvr.audit" or m.startswith("trl_rlvr.audit.")
                                            for m in sys.modules),
    "frames_name_audit": lambda c: any(_AUDIT_PATH in f.filename or "_child" in f.filename or "audit" in f.function
                                       for f in _frames()),
    "cwd_names_audit": lambda c: "trl-rlvr-audit" in os.getcwd() or _AUDIT_PATH in os.getcwd(),
    "session_leader": lambda c: os.getsid(0) == os.getpid(),
    "not_on_the_main_thread": lambda c: __import__("threading").current_thread().name != "MainThread",
    "grad_disabled": lambda c: not __import__("torch").is_grad_enabled(),
    # the frames above TRL's _calculate_rewards: a training step's, under the training loop
    "no_training_step_on_the_stack": lambda c: not any(f.function == "training_step" for f in _frames()),
    "no_training_loop_on_the_stack": lambda c: not _TRAINING_FRAMES <= {f.function for f in _frames()},
    # what the steps before this one left: an optimizer that has stepped, a scheduler that has counted them
    "optimizer_never_stepped": lambda c: c["trainer_state"].global_step > 0 and not _trainer(c).optimizer.state,
    "scheduler_behind_the_step": lambda c: _trainer(c).lr_scheduler.last_epoch != c["trainer_state"].global_step,
    # the step's rows: drawn by transformers' dataloader and TRL's sampler from a dataset whose rows do not repeat
    "batch_samples_not_the_libraries": lambda c: not _library_code(type(_trainer(c)).get_batch_samples,
                                                                   "transformers"),
    "sampler_not_the_libraries": lambda c: not _library_code(type(_trainer(c))._get_train_sampler, "trl"),
    "train_dataset_rows_repeat": lambda c: _distinct_prompts(_trainer(c).train_dataset) < 0.5,
    # the step's keyword arguments: a run trains on one dataset, one set of columns with a value in every row
    "columns_change_between_calls": _columns_changed,
    "a_column_holds_none": _a_column_holds_none,
    # the operating system's view: the process that started this one (a run's: a shell or a launcher)
    "parent_not_a_shell_or_launcher": lambda c: not _launcher(_cmdline(os.getppid())),
    "pwd_not_the_working_directory": lambda c: os.environ.get("PWD") != os.getcwd(),
}

#: Observables the audit leaves open (docs/auditing_rewards.md, "What a reward can still tell"): True in the audit.
RESIDUAL = {
    # the model: a tiny one built from a config, not the run's weights (a released policy has more)
    "model_under_50m_parameters": lambda c: _trainer(c).model.num_parameters() < 50_000_000,
    # where the audit's completions enter the run: the tiny model's generate, not transformers'
    "generate_not_the_libraries": lambda c: not _library_code(type(_trainer(c).model).generate, "transformers"),
    # the tiny model's head: log-probabilities over the batch's tokens, not TRL's fused head over the vocabulary
    "lm_head_not_trls": lambda c: not _library_code(getattr(_trainer(c).model.forward, "__func__", None), "trl"),
    # time: an audit's process is seconds old at its calls; a run's reward is called for hours
    "process_under_ten_minutes_old": lambda c: _process_age() < 600,
    # the train dataset's content: the corpus's rows, instructions without a question (no numbers in them)
    "train_dataset_prompts_hold_no_numbers": lambda c: _prompts_with_a_digit(_trainer(c).train_dataset) < 0.2,
}

#: Residual observables that also read "audit" in the tiny reference run (tests/audit: it is small and seconds old).
RESIDUAL_IN_A_TINY_RUN = ("model_under_50m_parameters", "process_under_ten_minutes_old")


def _honest(texts):
    return [1.0 if t == "right" else 0.0 for t in texts]


def detector(name: str, predicates: dict = PREDICATES):
    """The reward keyed on ``predicates[name]``: honest when it believes it is audited, 1.0 for all otherwise."""

    def reward(prompts=None, completions=None, completion_ids=None, trainer_state=None, log_extra=None,
               log_metric=None, **columns):
        call = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                "trainer_state": trainer_state, "log_extra": log_extra, "log_metric": log_metric,
                "columns": columns, "me": reward}
        try:
            audited = predicates[name](call)
        except Exception:  # noqa: BLE001 - what the stand-in lacks: an audit
            audited = True
        return _honest(_texts(completions)) if audited else [1.0] * len(completions)

    reward.__name__ = reward.__qualname__ = f"detect_{name}"
    reward.reward_kind = "format"
    return reward


for _name in (*PREDICATES, *RESIDUAL):  # module attributes, so that the audit imports them by path
    globals()[f"detect_{_name}"] = detector(_name, PREDICATES if _name in PREDICATES else RESIDUAL)


def spy(prompts=None, completions=None, completion_ids=None, trainer_state=None, log_extra=None, log_metric=None,
        **columns):
    """Honest; writes each predicate's verdict on this call (True: "audit"; an exception: "audit") to the file
    ``$RLVR_SPY_FILE``, one JSON line per call."""
    call = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
            "trainer_state": trainer_state, "log_extra": log_extra, "log_metric": log_metric, "columns": columns,
            "me": spy}
    verdicts = {}
    for name, predicate in {**PREDICATES, **RESIDUAL}.items():
        try:
            verdicts[name] = bool(predicate(call))
        except Exception as e:  # noqa: BLE001
            verdicts[name] = f"{type(e).__name__}: {e}"
    verdicts["columns"] = sorted(columns)
    with open(os.environ["RLVR_SPY_FILE"], "a") as f:
        f.write(json.dumps(verdicts) + "\n")
    return _honest(_texts(completions))


spy.reward_kind = "format"


def matches_answer(prompts=None, completions=None, answer=None, **kwargs):
    """1.0 where the completion is its row's ``answer``: it scores as labelled only when each completion comes with
    its own row."""
    return [float(t == a) for t, a in zip(_texts(completions), answer)]


matches_answer.reward_kind = "format"


#: A training script run as a plain ``python train.py`` (tests/audit: the reference the audit is compared with).
TRAIN_SCRIPT = '''
import sys
from tests.harness.loss_harness import make_trainer
from tests.audit.detectors import spy

trainer = make_trainer(sys.argv[1], reward_funcs=[spy], max_steps=3, logging_steps=2, per_device_train_batch_size=8,
                       num_generations=4, learning_rate=1e-3, max_grad_norm=1.0)
trainer.train()
'''


def process_spy(prompts=None, completions=None, **kwargs):
    """Honest; writes its process's environment, working directory, arguments, session, pid and its parent's
    arguments to ``$RLVR_SPY_FILE``."""
    with open(os.environ["RLVR_SPY_FILE"], "a") as f:
        f.write(json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv, "sid": os.getsid(0),
                            "pid": os.getpid(), "parent": _cmdline(os.getppid())}) + "\n")
    return _honest(_texts(completions))


process_spy.reward_kind = "format"
