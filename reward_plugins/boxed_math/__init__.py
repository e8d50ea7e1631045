"""``boxed_math``: 1.0 when every box after the reasoning states the gold answer (math-verify), else 0.0.

Modules: ``plugin`` (the reward: :class:`BoxedMathReward`, its factory :func:`boxed_math` and the ready-made
``reward``), ``boxes`` (where the answers are: boxes by brace matching, the answer line), ``answer_form`` (what a
box must hold to be one answer), ``value_form`` (whether an answer states values or restates the question, on the
parser's syntax tree), ``math_check`` (one (gold, answer) check with math-verify), ``pool`` (the worker
processes the checks run in, each with a hard deadline and a memory bound). Imports neither torch nor trl.
"""

from .plugin import BoxedMathReward, boxed_math, reward

__all__ = ["BoxedMathReward", "boxed_math", "reward"]
