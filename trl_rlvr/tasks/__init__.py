"""Small offline tasks the examples train on: :mod:`.word_problems` (multi-digit arithmetic word problems with held-out
wordings and tool-calling cold-start traces, examples/tool_r1.py's task)."""
