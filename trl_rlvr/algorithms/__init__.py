"""The pure maths of the trainer, on plain tensors (no trainer, no TRL trainer class imported here).

- :mod:`.advantages`: group advantages ``A_i = (r_i - baseline) / std(r)`` (group mean or leave-one-out,
  population or sample std), zero-signal groups and their expected share ``p^G + (1-p)^G``;
- :mod:`.losses`: the exact token count of an optimizer step (DAPO's per-token normalization);
- :mod:`.shaping`: the overlong (DAPO soft punishment) settings check;
- :mod:`.multi_turn`: the tool-RL stabilizers (void turns, a tool-call cap, short error replies, resample-on-correct);
- :mod:`.policy_shift`: how far one update moved the batch it trained on (log-prob change by sign, k3 KL);
- :mod:`.metrics`: the ``rlvr/`` rollout metrics (zero-signal share, lengths of right and wrong answers).
"""
