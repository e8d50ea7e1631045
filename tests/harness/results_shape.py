"""The field names of a committed results file, compared with what a run of today's code writes (not the values)."""

#: Fields whose contents are per-run lists of free size (the sample answers, per-question records) or paths.
FREE = {"samples", "per_question"}

#: Metrics logged since the committed runs, by rules that leave their values as they are (no reward returned None
#: in them and every reward worker started: boxed_math/bad_gold, infra_errors and errors are 0 at every step;
#: think_format, tool_format and overlong never return None), so each would read 0 at every step:
#: rlvr/unscorable_frac (rows a correctness check did not score) and boxed_math/worker_start_failures.
METRICS_ADDED_SINCE_THE_RUN = frozenset({"rlvr/unscorable_frac", "boxed_math/worker_start_failures"})


def shape(value, depth=0):
    """The field names of a metrics file (nested dicts; lists of dicts by their first element), not the values."""
    if isinstance(value, dict) and depth < 4:
        return {k: shape(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], dict) and depth < 4:
        return [shape(value[0], depth + 1)]
    return None


def per_k(key: str) -> str:
    """``pass@4`` -> ``pass@k``: metrics named by a sample count, which a smoke run with fewer samples names else."""
    head, at, k = key.partition("@")
    return f"{head}@k" if at and k.isdigit() else key


def fields(value, free=FREE, rename=lambda key: key):
    """``shape(value)`` with the free-size fields' contents left out, each key through ``rename``."""

    def strip(s):
        if isinstance(s, dict):
            return {rename(k): (None if k in free else strip(v)) for k, v in s.items()}
        if isinstance(s, list):
            return [strip(s[0])]
        return s

    return strip(shape(value))
