"""The audit's reward process: builds the reward and a trainer of the run, then scores one call per request.

Started by :mod:`trl_rlvr.audit.runner` as a script (a copy of this file, ``train.py`` in the audit's scratch
directory, run from there), so that no module of the audit is imported in the reward's process, and
``sys.argv``, ``__main__`` and the frames' files name no audit. It is the one module of ``trl_rlvr.audit`` that
imports the trainer and its config (tests/test_layout.py exempts it): no module of the package imports it. Requests and replies are JSON lines on private
copies of stdin/stdout; fd 0 is then /dev/null and fd 1 the child's stderr, so a reward (or code it runs) that
reads stdin or prints does not touch the channel.

The reward is called by the trainer of the run: the first request carries the run's settings, and the process
builds a real ``RLVRTrainer`` (or ``GRPOTrainer``, as the run drawn) on a tiny model built from a config, with
the run's tokenizer as its ``processing_class`` and a train dataset of the audit's rows, puts it in the state a
trainer has between ``train()``'s start and its first step (optimizer and scheduler built, model in training mode,
``is_in_train``, the callbacks' ``on_train_begin``), and each request is a call of TRL's own
``_calculate_rewards`` (RLVRTrainer's, then GRPOTrainer's) on the crafted completions: the reward gets
``trainer_state=trainer.state``, ``log_extra``/``log_metric`` bound to that trainer, the rows' columns, async
rewards run on TRL's event-loop thread, and a score's type, ``None`` and length rules are TRL's. The trainer state
is that trainer's one object, its fields set in place call by call to the drawn run's step (``_apply_state``).
"""

from __future__ import annotations

import base64
import json
import math
import numbers
import os
import pickle
import sys
import traceback


def _channel():
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return requests, replies


def _error(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {str(e)[:300]}{where}"


def _build(setup: dict):
    if setup.get("pickled"):
        return pickle.loads(base64.b64decode(setup["pickled"]))
    from trl_rlvr.rewards import resolve_reward_spec

    reward = resolve_reward_spec(setup["reward"], setup.get("options") or None)
    if isinstance(reward, str):  # a reward model's hub id or path: TRL's to load, not a function to audit
        raise TypeError(f"{reward!r} names a reward model (a hub id or a path), not a reward function: the audit "
                         "runs reward functions (a registered name or module:function)")
    return reward


# -------------------------------------------------------------------------------------------- the run's trainer
def _tokenizer(spec: dict):
    """The run's tokenizer as the trainer's ``processing_class``: the given file (with the configuration beside
    it, as the run loads it), else the tokenizer drawn for the audit."""
    from pathlib import Path

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if spec.get("path"):
        path = Path(spec["path"])
        try:
            tok = AutoTokenizer.from_pretrained(str(path.parent), local_files_only=True)
        except Exception:  # noqa: BLE001 - a bare tokenizer.json: no configuration to load it with
            tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    else:
        from tokenizers import Tokenizer

        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(spec["json"]))
    if tok.eos_token is None and spec.get("eos_token"):
        tok.eos_token = spec["eos_token"]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _model(tokenizer):
    """A tiny causal LM of the tokenizer's vocabulary, built from a config (nothing is downloaded)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return AutoModelForCausalLM.from_config(config)


def _dataset(rows: list[dict], size: int):
    """The train dataset: the audit's rows (prompt and columns; a column a row lacks is None), repeated to the
    run's dataset size. Columns whose values Arrow cannot hold in one column are stored as JSON text."""
    from datasets import Dataset

    names = list(dict.fromkeys(k for r in rows for k in r))
    rows = rows or [{"prompt": ""}]
    table = {k: [rows[i % len(rows)].get(k) for i in range(max(size, len(rows)))] for k in names}
    try:
        return Dataset.from_dict(table)
    except Exception:  # noqa: BLE001 - mixed types in a column (Arrow's errors vary)
        return Dataset.from_dict({k: v if k == "prompt" else [json.dumps(x) for x in v] for k, v in table.items()})


def _rows_a_run_accepts(reward, rows: list[dict]) -> list[dict]:
    """The rows a run could train on: RLVRTrainer refuses a dataset with a row the reward's ``check_rows`` rejects
    before the model loads, so such a row never reaches the reward in training; the audit still scores its case."""
    check = getattr(reward, "check_rows", None)
    if not callable(check):
        return rows
    kept = []
    for row in rows:
        try:
            check(_dataset([row], 1))
        except ValueError:
            continue
        kept.append(row)
    return kept


def _trainer(reward, run: dict, rows: list[dict], messages: bool):
    """The run's trainer, as ``train()`` leaves it before the first step."""
    import torch
    from transformers.trainer_callback import ExportableState, TrainerState

    settings = dict(run["settings"])
    name, size = settings.pop("trainer"), settings.pop("dataset_size")
    if not torch.cuda.is_available():  # bf16 is the configs' default on a GPU only
        settings["bf16"] = False
    if name == "RLVRTrainer":
        from trl_rlvr.config import RLVRConfig as config_class
        from trl_rlvr.trainer import RLVRTrainer as trainer_class
    else:
        from trl import GRPOConfig as config_class
        from trl import GRPOTrainer as trainer_class
    tokenizer = _tokenizer(run["tokenizer"])
    if messages:  # a conversational dataset's prompts
        rows = [{**r, "prompt": [{"role": "user", "content": r.get("prompt") or ""}]} for r in rows]
    trainer = trainer_class(model=_model(tokenizer), reward_funcs=[reward], args=config_class(**settings),
                            train_dataset=_dataset(_rows_a_run_accepts(reward, rows), size), processing_class=tokenizer)
    # what Trainer._inner_training_loop sets up before its first step
    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    trainer.state = TrainerState(stateful_callbacks=[cb for cb in [*trainer.callback_handler.callbacks, trainer.control]
                                                     if isinstance(cb, ExportableState)])
    trainer.state.train_batch_size = trainer._train_batch_size
    trainer.is_in_train = True
    trainer.model.train()
    return trainer


def _apply_state(trainer, fields: dict, first: bool) -> None:
    """The drawn run's state at this call, set in place on the trainer's one state object; the log's new entries
    appended (a log flushes the trainer's metrics), TRL's micro-step counter at the step's first micro-batch."""
    fields = dict(fields)
    new = fields.pop("log_new", [])
    fields.pop("log_history", None)
    state = trainer.state
    for k, v in fields.items():
        setattr(state, k, v)
    state.log_history.extend(new)
    if new:
        for metrics in trainer._metrics.values():
            metrics.clear()
    trainer._step = state.global_step * trainer.args.gradient_accumulation_steps
    if first:
        trainer.callback_handler.on_train_begin(trainer.args, state, trainer.control)


def _generation_metrics(trainer, ids: list[list[int]]) -> None:
    """What TRL's ``_generate`` logs of a generation before the rewards are called (its code, lines for lines:
    the token count, the completions' lengths, the clipped ratio, the terminated lengths)."""
    import torch

    metrics = trainer._metrics["train"]
    metrics["num_tokens"] = [trainer.state.num_input_tokens_seen]
    lengths = torch.tensor([len(x) for x in ids], dtype=torch.float32)
    metrics["completions/mean_length"].append(lengths.mean().item())
    metrics["completions/min_length"].append(lengths.min().item())
    metrics["completions/max_length"].append(lengths.max().item())
    eos_and_pad = [*trainer.eos_token_ids, trainer._tokenizer.pad_token_id]
    truncated = torch.tensor([not x or x[-1] not in eos_and_pad for x in ids])
    metrics["completions/clipped_ratio"].append(truncated.float().mean().item())
    ended = lengths[~truncated] if (~truncated).any() else torch.zeros(1)
    metrics["completions/mean_terminated_length"].append(ended.mean().item())
    metrics["completions/min_terminated_length"].append(ended.min().item())
    metrics["completions/max_terminated_length"].append(ended.max().item())


class Run:
    """The reward and, from the first request on, the run's trainer (or the error that building it raised)."""

    def __init__(self, reward, messages: bool):
        self.reward, self.messages = reward, messages
        self.trainer = None
        self.calls = 0
        self._failed: BaseException | None = None

    def ready(self, request: dict):
        if self.trainer is None and self._failed is None and "run" in request:
            try:
                self.trainer = _trainer(self.reward, request["run"], request.get("rows") or [], self.messages)
            except BaseException as e:  # noqa: BLE001 - every later call reports it
                self._failed = e
        if self._failed is not None:
            raise self._failed
        if self.trainer is None:
            raise RuntimeError("the first request did not carry the run's settings")
        return self.trainer


def _one_score(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"the reward returned a score of type {type(value).__name__}, not a number or None")
    value = float(value)
    if math.isnan(value):
        return None
    if math.isinf(value):
        raise ValueError(f"the reward returned an infinite score ({value})")
    return value


def score(run: Run, request: dict) -> list[float | None]:
    """One call of TRL's ``_calculate_rewards`` over the request's completions; their scores (``None``: not
    applicable, TRL's NaN)."""
    trainer = run.ready(request)
    items = request["items"]
    completions = [it["completion"] for it in items]
    prompts = [it.get("prompt") or "" for it in items]
    if run.messages:
        completions = [[{"role": "assistant", "content": c}] for c in completions]
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    keys = sorted({k for it in items for k in it.get("columns", {})})
    inputs = [{"prompt": p, **{k: it.get("columns", {}).get(k) for k in keys}} for p, it in zip(prompts, items)]
    _apply_state(trainer, request.get("state") or {}, first=run.calls == 0)
    run.calls += 1
    ids = [list(it["ids"]) for it in items]
    _generation_metrics(trainer, ids)
    rewards = trainer._calculate_rewards(inputs, prompts, completions, ids)
    return [_one_score(v) for v in rewards[:, 0].tolist()]


def main() -> None:
    requests, replies = _channel()
    setup = json.loads(requests.readline())
    sys.path[1:1] = [p for p in setup.get("path", []) if p not in sys.path]  # where the audit imports from
    try:
        import transformers  # noqa: F401 - first, as in a training process
        reward = _build(setup)
        if not callable(reward):
            raise TypeError(f"{setup.get('reward')!r} is not callable")
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which explains it
        replies.write(json.dumps({"fatal": str(e) if isinstance(e, (ValueError, TypeError, ImportError)) else _error(e)}) + "\n")
        return
    kind = getattr(reward, "reward_kind", None)
    replies.write(json.dumps({"ready": True, "name": getattr(reward, "__name__", repr(reward)),
                              "kind": kind if isinstance(kind, str) else None}) + "\n")
    run = Run(reward, setup.get("messages", False))
    for line in iter(requests.readline, b""):
        case = json.loads(line)
        try:
            reply = {"i": case["i"], "scores": score(run, case)}
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the reward raised it
            reply = {"i": case["i"], "error": _error(e)}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
