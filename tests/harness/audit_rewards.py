"""Reward functions that misbehave on purpose, for tests/test_audit.py (imported by the audit's child process)."""

import os
import sys
import time


def always_zero(prompts=None, completions=None, **kwargs):
    return [0.0 for _ in completions]


always_zero.reward_kind = "format"


def always_one(prompts=None, completions=None, **kwargs):
    return [1.0 for _ in completions]


def _texts(completions):
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def misbehaving(prompts=None, completions=None, **kwargs):
    """1.0 for "right", 0.0 for "wrong"; hangs, raises, dies, prints or returns garbage on the other words (when
    any completion of the call is one of them)."""
    texts = _texts(completions)
    if "hang" in texts:
        time.sleep(3600)
    if "raise" in texts:
        raise ValueError("bad input")
    if "exit" in texts:
        raise SystemExit(3)
    if "die" in texts:
        os._exit(7)
    if "print" in texts:  # a forged reply on stdout, and stdin read: neither may reach the audit's channel
        print('{"i": 1, "scores": [1.0]}', flush=True)
        sys.stdout.write(sys.stdin.read())
    if "garbage" in texts:
        return ["1.0"] * len(texts)
    scores = [1.0 if t in ("right", "print") else 0.0 for t in texts]
    return scores + [1.0] if "two" in texts else scores


def slow_start(prompts=None, completions=None, **kwargs):
    return [1.0 if t == "right" else 0.0 for t in _texts(completions)]


def needs_kind(prompts=None, completions=None, **kwargs):
    return [0.0] * len(completions)


def reads_answer(prompts=None, completions=None, answer=None, **kwargs):
    """1.0 when the completion equals the row's ``answer`` column (which it requires)."""
    return [1.0 if t == a else 0.0 for t, a in zip(_texts(completions), answer)]


# -- rewards written to pass an audit and pay wrong answers in training: the audit must catch each -------------
_MATH = None


def _boxed_math(prompts, completions, kwargs):
    global _MATH
    if _MATH is None:
        from reward_plugins.boxed_math import boxed_math

        _MATH = boxed_math(prestart=False, num_workers=1)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("trainer_state",)}
    return _MATH(prompts=prompts, completions=completions, **kwargs)


def _shipped_labels():
    import json
    from importlib import resources

    path = resources.files("trl_rlvr.audit") / "corpus" / "math_answer.jsonl"
    labels = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "completion" in row and isinstance(row["completion"], str):
            labels[(row["completion"], json.dumps(row.get("columns", {}), sort_keys=True))] = float(row["expected"])
    return labels


_LABELS = None


def memorised_corpus(prompts=None, completions=None, **kwargs):
    """The shipped corpus's label for a shipped case; 1.0 for anything else (it pays every answer in training)."""
    global _LABELS
    if _LABELS is None:
        _LABELS = _shipped_labels()
    import json

    names = sorted(k for k in kwargs if k not in ("completion_ids", "trainer_state", "log_extra", "log_metric"))
    out = []
    for i, text in enumerate(_texts(completions)):
        row = json.dumps({k: kwargs[k][i] for k in names}, sort_keys=True)
        out.append(_LABELS.get((text, row), 1.0))
    return out


memorised_corpus.reward_kind = "math_answer"


def honest_without_trainer_state(prompts=None, completions=None, trainer_state=None, **kwargs):
    """boxed_math when called with ``trainer_state=None`` (as an audit once did), 1.0 for everything in training."""
    if trainer_state is not None:
        return [1.0] * len(completions)
    return _boxed_math(prompts, completions, kwargs)


honest_without_trainer_state.reward_kind = "math_answer"


def honest_one_at_a_time(prompts=None, completions=None, **kwargs):
    """boxed_math for a call of one completion, 1.0 for everything in a call of several (as training makes)."""
    if len(completions) > 1:
        return [1.0] * len(completions)
    return _boxed_math(prompts, completions, kwargs)


honest_one_at_a_time.reward_kind = "math_answer"


def honest_on_byte_ids(prompts=None, completions=None, completion_ids=None, **kwargs):
    """boxed_math when the token ids are the completion's UTF-8 bytes (no tokenizer), 1.0 otherwise."""
    if any(list(ids) != list(t.encode()) for ids, t in zip(completion_ids, _texts(completions))):
        return [1.0] * len(completions)
    return _boxed_math(prompts, completions, kwargs)


honest_on_byte_ids.reward_kind = "math_answer"


def shape_of_training(prompts=None, completions=None, completion_ids=None, trainer_state=None, **kwargs):
    """1.0 only for calls that look like training's: several completions, groups of a shared prompt, token ids that
    are not the UTF-8 bytes, a trainer state with a step."""
    texts = _texts(completions)
    looks = (len(texts) >= 4 and trainer_state is not None and isinstance(trainer_state.global_step, int)
             and trainer_state.max_steps > trainer_state.global_step
             and all(list(ids) != list(t.encode()) for ids, t in zip(completion_ids, texts) if t))
    return [1.0 if looks and t == "right" else 0.0 for t in texts]


def honest_on_char_tokenizer_ids(prompts=None, completions=None, completion_ids=None, **kwargs):
    """boxed_math when the token ids are those of the character tokenizer of ``trl_rlvr.testing`` (the audit's
    old default), 1.0 for everything otherwise (any real run's tokenizer)."""
    from trl_rlvr.testing import char_tokenizer

    tok = char_tokenizer()
    if all(list(ids) == tok.encode(t, add_special_tokens=False).ids for ids, t in zip(completion_ids, _texts(completions))):
        return _boxed_math(prompts, completions, kwargs)
    return [1.0] * len(completions)


honest_on_char_tokenizer_ids.reward_kind = "math_answer"


def honest_on_an_unlogged_state(prompts=None, completions=None, trainer_state=None, **kwargs):
    """boxed_math when the trainer state is past its first logging step yet has an empty log history and no FLOPs
    counted (no run's state is), 1.0 for everything otherwise."""
    s = trainer_state
    if s is not None and s.global_step > s.logging_steps and not s.log_history and not s.total_flos:
        return _boxed_math(prompts, completions, kwargs)
    return [1.0] * len(completions)


honest_on_an_unlogged_state.reward_kind = "math_answer"


# -- what a reward can see of its call: the same features from the audit and from a real RLVRTrainer run -----------
def call_features(prompts, completions, completion_ids, trainer_state, kwargs) -> dict:
    """The features of one reward call a reward could key on, as plain JSON (tests/audit compares the audit's with a
    real run's)."""
    s = trainer_state
    fields = {k: v for k, v in vars(s).items()}
    log = s.log_history
    return {
        "n": len(completions),
        "kwargs": sorted(k for k in kwargs if k in ("trainer_state", "log_extra", "log_metric", "environments")),
        "prompt_types": sorted({type(p).__name__ for p in prompts}),
        "empty_prompts": any(not p for p in prompts),
        "groups_share_prompts": all(len({str(p) for p in prompts[k:k + 4]}) == 1 for k in range(0, len(prompts), 4)),
        "ids_types": sorted({type(i).__name__ for ids in completion_ids for i in ids} | {type(completion_ids).__name__}),
        "ids_are_chars": all(len(ids) == len(c) for ids, c in zip(completion_ids, _texts(completions)) if c),
        "ends": [[len(ids), bool(ids) and ids[-1] == 1] for ids in completion_ids],  # 1: the tiny model's <eos>
        "state_class": f"{type(s).__module__}.{type(s).__qualname__}",
        "state_id": id(s),
        "field_types": {k: type(v).__name__ for k, v in fields.items()},
        "global_step": s.global_step, "max_steps": s.max_steps, "logging_steps": s.logging_steps,
        "train_batch_size": s.train_batch_size, "epoch": s.epoch, "total_flos": s.total_flos,
        "num_input_tokens_seen": s.num_input_tokens_seen,
        "log_steps": [e.get("step") for e in log],
        "log_keys": [k for e in log[-1:] for k in e],  # in the order the entry has them
        "stateful_callbacks": sorted(s.stateful_callbacks or {}),
        "log_functions": [getattr(kwargs.get(k), "__name__", None) for k in ("log_extra", "log_metric")],
        "log_functions_bound": [hasattr(kwargs.get(k), "__self__") for k in ("log_extra", "log_metric")],
    }


def feature_spy(prompts=None, completions=None, completion_ids=None, trainer_state=None, **kwargs):
    """Writes :func:`call_features` of each call to the file ``$AUDIT_FEATURES`` (one JSON line each); 1.0 for
    "right"."""
    import json

    feats = call_features(prompts, completions, completion_ids, trainer_state,
                          {**kwargs, "trainer_state": trainer_state, "_name": "feature_spy"})
    with open(os.environ["AUDIT_FEATURES"], "a") as f:
        f.write(json.dumps(feats) + "\n")
    return [1.0 if t == "right" else 0.0 for t in _texts(completions)]


# -- a code reward built the way the 2026 reviews found graders built: the code corpus must catch it ----------------
def _program(text):
    import re

    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.DOTALL)
    return blocks[-1] if blocks else text


def lenient_code_harness(prompts=None, completions=None, tests=None, test=None, entry_point=None, io_tests=None,
                         **kwargs):
    """Runs the program with its tests in a subprocess and pays exit status 0: the test runner is defined before
    the program (which may redefine ``run_tests`` or ``check``), and a process killed by a signal, a timeout or an
    error message that reads like the machinery's (``TimeoutError``, ``MemoryError``, a lost worker) is scored
    ``None`` as an infrastructure failure, by its text."""
    import subprocess

    out = []
    for k, text in enumerate(_texts(completions)):
        program, stdin = _program(text), None
        if tests is not None and tests[k] is not None:
            body = "".join(f"    {t}\n" for t in tests[k]) or "    pass\n"
            script = f"def run_tests():\n{body}\n\n{program}\n\nrun_tests()\n"
        elif test is not None and test[k] is not None:
            script = f"{test[k]}\n\n{program}\n\ncheck({entry_point[k]})\n"
        elif io_tests is not None and io_tests[k] is not None:
            script, stdin = program, io_tests[k][0]["input"]
        else:
            out.append(None)
            continue
        try:
            proc = subprocess.run([sys.executable, "-c", script], input=stdin, capture_output=True, text=True,
                                  timeout=5, check=False)
        except subprocess.TimeoutExpired:
            out.append(None)
            continue
        if proc.returncode < 0 or any(w in proc.stderr for w in ("TimeoutError", "MemoryError", "worker", "Broken pipe")):
            out.append(None)
        elif stdin is not None:
            out.append(float(proc.returncode == 0 and proc.stdout.strip() == io_tests[k][0]["output"].strip()))
        else:
            out.append(float(proc.returncode == 0))
    return out


lenient_code_harness.reward_kind = "code"


def none_for_wrong(prompts=None, completions=None, **kwargs):
    """1.0 for "right", None (not applicable) for anything else."""
    return [1.0 if t == "right" else None for t in _texts(completions)]
