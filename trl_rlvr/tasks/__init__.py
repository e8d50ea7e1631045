"""Small offline tasks the examples train on: :mod:`.word_problems` (multi-digit arithmetic word problems with held-out
wordings and tool-calling cold-start traces, examples/tool_r1.py's task), :mod:`.tool_arithmetic` (that job's options,
data, rewards and stages) and :mod:`.tool_job` (one run of its stages, shared by the recipe and its lab,
benchmarks.tool_arms)."""
