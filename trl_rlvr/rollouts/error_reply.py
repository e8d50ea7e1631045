"""``RLVRConfig.tool_error_reply``: ToRL's error replies (Li et al. 2025, arXiv 2503.23383), set on the environments.

The cut itself is the environment's own option (``PythonEnvironment(error_reply="last_line")``: a call that raised,
by the environment's own ``stats["errors"]``, replies with its error's last line), so that training and every
evaluation that builds environments from the same factory reply alike. TRL 1.16 builds environments from
``environment_factory`` when it needs them (one at ``__init__``, the rest per batch, from a pool), so the trainer
hands TRL a factory whose environments carry the option: :func:`with_error_reply`.
"""

from __future__ import annotations

import functools


def with_error_reply(environment_factory, error_reply: str):
    """``environment_factory`` (a callable, a ``{name: callable}`` of several environments, or None) whose
    environments with an ``error_reply`` option get ``error_reply``; ``"full"`` (the default) returns the factory
    as it is, so that a factory's own option (``partial(PythonEnvironment, error_reply="last_line")``) stands.
    Environments without the option are built as they are."""
    if error_reply == "full" or environment_factory is None:
        return environment_factory
    if isinstance(environment_factory, dict):
        return {name: with_error_reply(factory, error_reply) for name, factory in environment_factory.items()}
    return functools.partial(_build, environment_factory, error_reply)


def _build(environment_factory, error_reply: str):
    environment = environment_factory()
    if hasattr(environment, "error_reply"):
        environment.error_reply = error_reply
    return environment
