"""Imported by the fork server before it forks boxed_math's workers: they start with math-verify warm."""

from reward_plugins._math_check import warm

warm()
