"""The audit's child process: builds the reward once, then scores one case per request.

Run by :mod:`trl_rlvr.audit.runner` as ``python -m trl_rlvr.audit._child``. Requests and replies are JSON lines
on private copies of stdin/stdout; fd 0 is then /dev/null and fd 1 the child's stderr, so a reward (or code it
runs) that reads stdin or prints does not touch the channel. The reward is called as TRL's GRPOTrainer calls it,
one call per request of several completions (:mod:`trl_rlvr.audit.batches`): ``reward(prompts=[...],
completions=[...], completion_ids=[...], trainer_state=<a transformers.TrainerState>, log_extra=...,
log_metric=..., **columns)``, each column a list with one value per completion; the trainer state is one object,
updated in place call by call (``_State``), as a run's is.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import inspect
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


@dataclasses.dataclass
class TrainerState:
    """The fields of ``transformers.TrainerState``, for a process where transformers cannot be imported (TRL needs
    it, so a reward that TRL can train with never meets this class)."""

    epoch: float | None = None
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int | None = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list = dataclasses.field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict | None = None
    stateful_callbacks: dict | None = None


def _state_class():
    """``transformers.TrainerState``, imported before the reward is built: in training the reward's process has
    transformers (and torch) imported and ``trainer_state`` is that class."""
    try:
        from transformers.trainer_callback import TrainerState as state_class
    except ImportError:
        state_class = TrainerState
    return state_class


class _Trainer:
    """What ``log_extra`` and ``log_metric`` are bound to, as GRPOTrainer's are to the trainer (scalars and
    columns a reward logs go nowhere: the audit reads scores only)."""

    def _log_completion_extra(self, column: str, values: list) -> None:
        pass

    def _log_metric(self, name: str, value: float) -> None:
        pass


class _State:
    """One trainer state object for the whole process, updated in place call by call, as a run's is."""

    def __init__(self):
        self.cls = _state_class()
        self.obj = None

    def update(self, fields: dict | None):
        if fields is None:
            return None
        fields = dict(fields)
        new = fields.pop("log_new", [])
        if self.obj is None:
            self.obj = self.cls(**{k: v for k, v in fields.items() if k != "log_history"})
        else:
            for k, v in fields.items():
                setattr(self.obj, k, v)
        self.obj.log_history.extend(new)
        return self.obj


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


_TRAINER = _Trainer()


def score(reward, request: dict, messages: bool, state: _State | None = None) -> list[float | None]:
    """One call of the reward over the request's completions; their scores (``None``: not applicable, NaN too)."""
    items = request["items"]
    completions = [it["completion"] for it in items]
    prompts = [it.get("prompt") or "" for it in items]
    if messages:
        completions = [[{"role": "assistant", "content": c}] for c in completions]
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    keys = sorted({k for it in items for k in it.get("columns", {})})
    columns = {k: [it.get("columns", {}).get(k) for it in items] for k in keys}
    state = state if state is not None else _State()
    out = reward(prompts=prompts, completions=completions, completion_ids=[list(it["ids"]) for it in items],
                 trainer_state=state.update(request.get("state")), log_extra=_TRAINER._log_completion_extra,
                 log_metric=_TRAINER._log_metric, **columns)
    if inspect.isawaitable(out):
        out = asyncio.run(out)
    if not isinstance(out, (list, tuple)) or len(out) != len(items):
        raise TypeError(f"the reward returned {type(out).__name__} {str(out)[:60]}, not a list of {len(items)} "
                        "scores (one per completion)")
    return [_one_score(v) for v in out]


def main() -> None:
    requests, replies = _channel()
    setup = json.loads(requests.readline())
    try:
        state = _State()  # transformers first, as in a training process
        reward = _build(setup)
        if not callable(reward):
            raise TypeError(f"{setup.get('reward')!r} is not callable")
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which explains it
        replies.write(json.dumps({"fatal": str(e) if isinstance(e, (ValueError, TypeError, ImportError)) else _error(e)}) + "\n")
        return
    kind = getattr(reward, "reward_kind", None)
    replies.write(json.dumps({"ready": True, "name": getattr(reward, "__name__", repr(reward)),
                              "kind": kind if isinstance(kind, str) else None}) + "\n")
    if setup.get("workdir"):
        os.chdir(setup["workdir"])  # after the import: files a case writes land in the audit's scratch directory
    for line in iter(requests.readline, b""):
        case = json.loads(line)
        try:
            reply = {"i": case["i"], "scores": score(reward, case, setup.get("messages", False), state)}
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the reward raised it
            reply = {"i": case["i"], "error": _error(e)}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
