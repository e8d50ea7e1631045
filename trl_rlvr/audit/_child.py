"""The audit's child process: builds the reward once, then scores one case per request.

Run by :mod:`trl_rlvr.audit.runner` as ``python -m trl_rlvr.audit._child``. Requests and replies are JSON lines
on private copies of stdin/stdout; fd 0 is then /dev/null and fd 1 the child's stderr, so a reward (or code it
runs) that reads stdin or prints does not touch the channel. The reward is called as TRL's GRPOTrainer calls it:
``reward(prompts=[p], completions=[c], completion_ids=[...], trainer_state=None, log_extra=..., log_metric=...,
**columns)``, each column a one-element list.
"""

from __future__ import annotations

import asyncio
import base64
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


def score(reward, case: dict, messages: bool) -> float | None:
    """One case through the reward; the one score it returned (``None`` for not applicable, NaN too)."""
    completion, prompt = case["completion"], case.get("prompt") or ""
    if messages:
        completion = [{"role": "assistant", "content": completion}]
        prompt = [{"role": "user", "content": prompt}]
    columns = {k: [v] for k, v in case.get("columns", {}).items()}
    out = reward(prompts=[prompt], completions=[completion], completion_ids=[list(case["completion"].encode())],
                 trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None, **columns)
    if inspect.isawaitable(out):
        out = asyncio.run(out)
    if not isinstance(out, (list, tuple)) or len(out) != 1:
        raise TypeError(f"the reward returned {type(out).__name__} {str(out)[:60]}, not a list of one score")
    value = out[0]
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


def main() -> None:
    requests, replies = _channel()
    setup = json.loads(requests.readline())
    try:
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
            reply = {"i": case["i"], "score": score(reward, case, setup.get("messages", False))}
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the reward raised it
            reply = {"i": case["i"], "error": _error(e)}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
