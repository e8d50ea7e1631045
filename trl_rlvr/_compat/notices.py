"""Third-party notices that are not the user's to act on, silenced where they arise (never process-wide)."""

from __future__ import annotations

import contextlib
import warnings

#: TRL 1.16's ``unwrap_model_for_generation`` reads ``model.is_gradient_checkpointing``, a property transformers 5
#: deprecated: TRL's to change, raised at every generation.
_TRL_GENERATION_NOTICE = "`is_gradient_checkpointing` is deprecated"


@contextlib.contextmanager
def trl_generation_notices_silenced():
    """Within the block only: drop the deprecation notice TRL's generation helper triggers."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TRL_GENERATION_NOTICE, category=FutureWarning)
        yield
