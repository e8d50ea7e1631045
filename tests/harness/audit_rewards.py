"""Reward functions that misbehave on purpose, for tests/test_audit.py (imported by the audit's child process)."""

import os
import sys
import time


def always_zero(prompts=None, completions=None, **kwargs):
    return [0.0 for _ in completions]


always_zero.reward_kind = "format"


def always_one(prompts=None, completions=None, **kwargs):
    return [1.0 for _ in completions]


def _text(completions):
    return completions[0] if isinstance(completions[0], str) else completions[0][-1]["content"]


def misbehaving(prompts=None, completions=None, **kwargs):
    """1.0 for "right", 0.0 for "wrong"; hangs, raises, dies, prints or returns garbage on the other words."""
    text = _text(completions)
    if text == "hang":
        time.sleep(3600)
    if text == "raise":
        raise ValueError("bad input")
    if text == "exit":
        raise SystemExit(3)
    if text == "die":
        os._exit(7)
    if text == "print":  # a forged reply on stdout, and stdin read: neither may reach the audit's channel
        print('{"i": 1, "score": 1.0}', flush=True)
        sys.stdout.write(sys.stdin.read())
    if text == "garbage":
        return ["1.0"]
    if text == "two":
        return [1.0, 1.0]
    return [1.0 if text in ("right", "print") else 0.0]


def slow_start(prompts=None, completions=None, **kwargs):
    return [1.0 if _text(completions) == "right" else 0.0]


def needs_kind(prompts=None, completions=None, **kwargs):
    return [0.0]


def reads_answer(prompts=None, completions=None, answer=None, **kwargs):
    """1.0 when the completion equals the row's ``answer`` column (which it requires)."""
    return [1.0 if _text(completions) == answer[0] else 0.0]
