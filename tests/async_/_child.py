"""What the asynchronous trainer's reward process does with what it is sent, run in a spawned interpreter: unpickle
a reward function and score, or unpickle an environment factory, build an environment and run tool calls."""

import pickle


def score(payload: bytes, kwargs: dict) -> list:
    """``payload``: a pickled reward function; its scores of ``kwargs``."""
    return list(pickle.loads(payload)(**kwargs))


def run_environment(payload: bytes, calls: list[str]) -> dict:
    """``payload``: a pickled environment factory; the replies of one rollout's ``python`` calls, its stats and its
    ``error_reply``."""
    with pickle.loads(payload)() as environment:
        environment.reset()
        replies = [environment.python(code) for code in calls]
        return {"replies": replies, "stats": dict(environment.stats), "error_reply": environment.error_reply}
