"""Third-party notices that are not the user's to act on, silenced once, narrowly (by message and module).

A ``warnings.catch_warnings()`` block around each call would look more local, but leaving it restores the filter
list, and every change to that list makes Python forget which warnings it has already shown (the once-per-location
registry is invalidated): each of TRL's and transformers' own warnings would then print again at every generation
instead of once. So the filter is installed once, and only if absent.
"""

from __future__ import annotations

import warnings

#: TRL 1.16's ``unwrap_model_for_generation`` and ``disable_gradient_checkpointing`` read
#: ``model.is_gradient_checkpointing``, a property transformers 5 deprecated (raised in ``transformers.modeling_utils``):
#: TRL's to change, raised at every generation.
_TRL_GENERATION_NOTICE = r"`is_gradient_checkpointing` is deprecated"
_RAISED_IN = r"transformers\.modeling_utils"


def silence_trl_generation_notice() -> None:
    """Drop transformers' deprecation notice for ``is_gradient_checkpointing`` (which TRL's generation helpers
    trigger), from now on; a no-op when the filter is already there, so the filter list changes at most once."""
    for action, message, category, module, _ in warnings.filters:
        if (action, category) == ("ignore", FutureWarning) and getattr(message, "pattern", None) == _TRL_GENERATION_NOTICE \
                and getattr(module, "pattern", None) == _RAISED_IN:
            return
    warnings.filterwarnings("ignore", message=_TRL_GENERATION_NOTICE, category=FutureWarning, module=_RAISED_IN)
