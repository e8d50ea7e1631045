"""Which rows reach the loss, round after round: the one round pipeline every training round goes through, with its
row rules (the stabilizers), dynamic sampling (drop zero-signal groups, refill), selective sampling (skip prompts
predicted to be zero-signal), and the checkpointed prompt stream they draw from.

- :mod:`.dynamic`: the filter and refill pieces (pure), :class:`PromptStream`;
- :mod:`.selective`: the per-prompt history and its skip rule (pure);
- :mod:`.rounds`: the typed records a round and a generation batch carry from generation to the loss and the logs;
- :mod:`.redistribute`: dynamic sampling's hand-over of kept rows between processes (only kept rows move);
- :mod:`.trained_metrics`: TRL's reward and length metrics, of the rows trained on; what dynamic sampling's rounds logged;
- :mod:`.row_rules`: the stabilizers, each one rule acting at score time and/or keep time;
- :mod:`.driver`: the round driver that runs every training round for the trainer;
- :mod:`.empty_updates`: the optimizer steps fed only by empty batches, skipped.
"""

from trl_rlvr.sampling.dynamic import (
    PromptStream,
    concat_rows,
    informative_rows,
    prompts_for_round,
    rows_per_process,
)
from trl_rlvr.sampling.selective import PromptHistory, record_groups

__all__ = [
    "PromptHistory",
    "PromptStream",
    "concat_rows",
    "informative_rows",
    "prompts_for_round",
    "record_groups",
    "rows_per_process",
]
