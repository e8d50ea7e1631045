"""What the audit hands a reward is what a run hands it at the same step: the run's token ids (or, with none given,
ids no reward can recompute), one trainer state object updated in place with the log a run has at that step, calls
of one size. A real RLVRTrainer run on the tiny model is the reference: the features a reward could key on
(``tests.harness.audit_rewards.call_features``) are compared call by call. The two rewards written to tell the
previous audit from training (keyed on its character tokenizer's ids; on a state past its first logging step with
an empty log) are caught."""

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import audit_rewards
from trl_rlvr.audit import audit_reward, builtin_corpus
from trl_rlvr.audit.batches import Call, Item, Tokenizer, TrainingRun, plan
from trl_rlvr.audit.cases import Case


def _cases(tmp_path, rows, name="cases.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _math_subset(tmp_path, classes=("agreement", "hedging")):
    rows = [{"id": c.id, "class": c.cls, "completion": c.completion, "expected": c.expected, "columns": c.columns}
            for c in builtin_corpus("math_answer").cases if c.cls in classes]
    return _cases(tmp_path, rows, "math.jsonl")


# -- the two rewards that told the previous audit from training -----------------------------------------------------
def _training_state(step=3, logging_steps=2):
    """A state as TRL's trainer has it at ``step`` (a log entry per logging step passed, GRPO's FLOPs: none)."""
    from transformers.trainer_callback import TrainerState

    return TrainerState(epoch=step / 64, global_step=step, max_steps=100, logging_steps=logging_steps,
                        train_batch_size=8, num_train_epochs=2, total_flos=0.0,
                        log_history=[{"loss": 0.0, "reward": 0.5, "epoch": s / 64, "step": s}
                                     for s in range(logging_steps, step + 1, logging_steps)])


@pytest.mark.parametrize("name", ["honest_on_char_tokenizer_ids", "honest_on_an_unlogged_state"])
def test_a_reward_that_tells_the_previous_audit_from_training_is_caught(name, tmp_path):
    reward = getattr(audit_rewards, name)
    # the attack is real: in a call shaped like training's (a real tokenizer's ids, a run's state) it pays a wrong
    # answer, and in the previous audit's call (character ids; a state past its first logging step with no log) it
    # is boxed_math
    wrong = r"The answer is \boxed{8}"
    training = reward(prompts=["q"], completions=[wrong], completion_ids=[[785, 4226, 374, 1124, 79075, 90, 23, 92]],
                      trainer_state=_training_state(), solution=["7"])
    assert training == [1.0]
    from trl_rlvr.testing import char_tokenizer

    old_state = _training_state()
    old_state.log_history = []
    old = reward(prompts=["q"], completions=[wrong], completion_ids=[char_tokenizer().encode(wrong).ids],
                 trainer_state=old_state, solution=["7"])
    assert old == [0.0]
    # and the audit now catches it, whatever its seed
    for seed in (1, 2):
        report = audit_reward(f"tests.harness.audit_rewards:{name}", cases=[_math_subset(tmp_path)], builtin=False,
                              kind="math_answer", seed=seed, variants=1)
        assert not report.passed and len(report.false_positives) >= 10, (seed, report.reasons())


def test_with_the_runs_tokenizer_the_ids_are_the_runs(tmp_path, tiny_model_dir):
    from trl_rlvr.testing import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    for source in (tiny_model_dir, tiny_model_dir / "tokenizer.json"):
        t = Tokenizer(source)
        assert t.given and t.ids("def f(x):\n  return x + 1") == tuple(tok.encode("def f(x):\n  return x + 1",
                                                                               add_special_tokens=False))
        assert t.eos_id == tok.eos_token_id
    with pytest.raises(ValueError, match="no tokenizer file"):
        Tokenizer(tmp_path / "missing.json")


def test_without_a_tokenizer_the_ids_are_drawn_per_audit_and_the_report_says_so(tmp_path):
    texts = [c.completion for c in builtin_corpus("math_answer").cases]
    a, b = (Tokenizer(None, texts, random.Random(s)) for s in (1, 2))
    text = r"So the answer is \boxed{\frac{1}{2}}."
    from trl_rlvr.testing import char_tokenizer

    assert not a.given and "none given" in a.name
    assert a.ids(text) != b.ids(text)  # no two audits share ids
    assert a.ids(text) == Tokenizer(None, texts, random.Random(1)).ids(text)  # the seed repeats them
    for t in (a, b):
        ids = t.ids(text)
        assert len(ids) < len(text) and list(ids) != char_tokenizer().encode(text).ids and max(ids) > 255
    report = audit_reward("think_format", seed=4, variants=0)
    assert report.calls["tokenizer_given"] is False and "none given" in report.calls["tokenizer"]


# -- the trainer state: a run's, step by step ------------------------------------------------------------------------
def _log_rule(states, logging_steps):
    """Each state's log has one entry per logging step passed, the last at the latest one."""
    for s in states:
        steps = s["log_steps"]
        assert steps == list(range(logging_steps, s["global_step"] + 1, logging_steps))[-len(steps):] if steps else \
            s["global_step"] < logging_steps


def _ends_as_trl_keeps_them(calls, max_completion_length):
    """Each completion's ids end with the end-of-sequence token, unless it ran to ``max_completion_length``."""
    for c in calls:
        for length, eos in c["ends"]:
            assert eos or length >= max_completion_length, (length, eos)


def _compare(real, audit):
    """The features of the audit's calls against a real run's, rule by rule."""
    for calls in (real, audit):
        assert len({c["n"] for c in calls}) == 1  # every call of a run has one size
        assert len({c["state_id"] for c in calls}) == 1  # one state object, updated in place
        steps = [c["global_step"] for c in calls]
        assert steps == list(range(steps[0], steps[0] + len(steps)))  # one step per call
        seen = [c["num_input_tokens_seen"] for c in calls]
        assert seen == sorted(seen) and len(set(seen)) == len(seen)
        assert all(c["total_flos"] == 0 for c in calls)  # a GRPO run counts no FLOPs (its inputs hold no input_ids)
        assert all(c["n"] % c["train_batch_size"] == 0 for c in calls)
        _log_rule(calls, calls[0]["logging_steps"])
    for key in ("kwargs", "prompt_types", "empty_prompts", "groups_share_prompts", "ids_types", "state_class",
                "stateful_callbacks", "log_functions", "log_functions_bound"):
        assert {json.dumps(c[key]) for c in audit} == {json.dumps(real[0][key])}, key

    def kind(c):  # what the field types depend on in a run: the first step, whether a log was written
        return c["global_step"] == 0, bool(c["log_steps"])

    real_types = {kind(c): c["field_types"] for c in real}
    for c in audit:
        if kind(c) in real_types:
            assert c["field_types"] == real_types[kind(c)], kind(c)
        else:  # a resumed run's first steps: a log (restored), floats
            assert c["field_types"] == real_types[(False, True)]
    real_keys = next(c["log_keys"] for c in real if c["log_keys"])
    for c in audit:
        if c["log_keys"]:  # RLVRTrainer's log, or GRPOTrainer's (the same without RLVRTrainer's keys), in order
            assert c["log_keys"] in (real_keys, [k for k in real_keys if not k.startswith("rlvr/")])


@pytest.mark.slow
def test_the_audits_calls_look_like_a_real_runs_call_by_call(tmp_path, tiny_model_dir, monkeypatch):
    from tests.harness.loss_harness import make_trainer

    real_file, audit_file = tmp_path / "real.jsonl", tmp_path / "audit.jsonl"
    monkeypatch.setenv("AUDIT_FEATURES", str(real_file))
    trainer = make_trainer(tiny_model_dir, reward_funcs=[audit_rewards.feature_spy], max_steps=5, logging_steps=2,
                           per_device_train_batch_size=8, num_generations=4, learning_rate=1e-3, max_grad_norm=1.0)
    trainer.train()
    real = [json.loads(line) for line in real_file.read_text().splitlines()]
    assert len(real) == 5 and real[-1]["log_steps"] == [2, 4]
    _ends_as_trl_keeps_them(real, trainer.args.max_completion_length)
    assert any(eos for c in real for _, eos in c["ends"]) or all(n == trainer.args.max_completion_length
                                                                   for c in real for n, _ in c["ends"])
    rows = [{"id": f"r{k}", "class": "c", "completion": "right" if k % 2 else "wrong", "expected": k % 2,
             "columns": {"answer": "0"}} for k in range(60)]
    monkeypatch.setenv("AUDIT_FEATURES", str(audit_file))
    for seed in (0, 1, 2):
        audit_file.write_text("")
        report = audit_reward("tests.harness.audit_rewards:feature_spy", cases=[_cases(tmp_path, rows)],
                              builtin=False, kind="format", seed=seed, variants=0, tokenizer=tiny_model_dir)
        assert report.passed, report.reasons()
        audit = [json.loads(line) for line in audit_file.read_text().splitlines()]
        assert len(audit) == report.calls["calls"] + 1  # and the warm-up, a call of the run like the others
        _compare(real, audit)
        _ends_as_trl_keeps_them(audit, report.calls["run"]["max_completion_length"])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(1, 4), st.integers(1, 60))
def test_property_a_drawn_runs_settings_make_each_call_one_step(seed, group_size, groups_per_call, n_cases):
    """Whatever the seed and shape: calls of one size, that size one optimizer step of the drawn run (batch size
    times gradient accumulation), room in ``max_steps`` for every call and a warm-up, and each completion's ids as
    the policy generates them (ending with the end-of-sequence token, or cut at ``max_completion_length``)."""
    rng = random.Random(seed)
    cases = [[Case(id=f"c{k}", cls="c", completion="x" * (k + 1) * 40, expected=k % 2, columns={"answer": "1"})]
             for k in range(n_cases)]
    tok = Tokenizer(None, ["x" * 50, "some text"], rng)
    calls = plan(cases, tok, rng, group_size=group_size, groups_per_call=groups_per_call)
    size = group_size * groups_per_call
    assert {len(c.items) for c in calls} == {size}
    run = TrainingRun(rng, len(calls), size, group_size, "my_reward", eos_id=tok.eos_id)
    settings = run.trainer_settings()
    assert settings["per_device_train_batch_size"] * settings["gradient_accumulation_steps"] == size
    assert settings["max_steps"] > len(calls) + 1 and settings["num_generations"] == group_size
    cap = settings["max_completion_length"]
    for call in calls:
        for raw, it in zip(call.items, run.prepare(call).items):
            assert it.ids == (raw.ids[:cap] if len(raw.ids) >= cap else (*raw.ids, tok.eos_id))
    assert all(isinstance(c, Call) and all(isinstance(it, Item) for it in c.items) for c in calls)


# -- the trainer behind the call: a run's, and nothing a reward can read tells the audit ------------------------------
_SPY_ROWS = [{"id": f"{w}{k}", "class": "c", "completion": w if w != "empty" else "", "expected": int(w == "right"),
              "columns": {"answer": str(k)}} for k in range(3) for w in ("right", "wrong", "empty")]


#: Cases of two formats (two sets of columns): the rows above, and the same with their answer in ``solution``.
_TWO_FORMATS = _SPY_ROWS + [{**r, "id": f"s-{r['id']}", "columns": {"solution": r["columns"]["answer"]}}
                            for r in _SPY_ROWS]


def _spy_audit(tmp_path, monkeypatch, rows=_SPY_ROWS, **kwargs):
    """The verdicts of every detector predicate on every call of an audit of ``detectors.spy``."""
    out = tmp_path / "verdicts.jsonl"
    out.write_text("")
    monkeypatch.setenv("RLVR_SPY_FILE", str(out))
    report = audit_reward("tests.audit.detectors:spy", cases=[_cases(tmp_path, rows)], builtin=False,
                          kind="format", variants=0, **kwargs)
    assert report.passed, report.reasons()
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    # every call, and each process's warm-up
    assert len(verdicts) == report.calls["calls"] + len(report.startup_seconds)
    return verdicts


def _audited(verdicts, names):
    return sorted({name for v in verdicts for name in names if v[name] is not False})


@pytest.mark.parametrize("seed, tokenizer", [(5, None), (6, "tiny")])
def test_no_detector_predicate_tells_the_audit_from_training(seed, tokenizer, tmp_path, monkeypatch, tiny_model_dir):
    """Every observable of :data:`tests.audit.detectors.PREDICATES` reads as training in every call of the audit
    (with a drawn tokenizer and with the run's); the residual ones still read as the audit (the docs list them)."""
    from tests.audit.detectors import PREDICATES, RESIDUAL

    verdicts = _spy_audit(tmp_path, monkeypatch, seed=seed,
                          tokenizer=tiny_model_dir if tokenizer == "tiny" else None)
    assert _audited(verdicts, PREDICATES) == []
    assert _audited(verdicts, RESIDUAL) == sorted(RESIDUAL)


def test_each_set_of_columns_is_a_run_of_its_own(tmp_path, monkeypatch):
    """Cases of two formats: a run trains on one dataset, so every call a reward's process gets passes the same
    keyword arguments, with a value in every row (the audit trains a process per set of columns); a reward keyed
    on a change of its keyword arguments or on a missing value reads "training" in every call, so it is audited."""
    verdicts = _spy_audit(tmp_path, monkeypatch, rows=_TWO_FORMATS, seed=3)
    assert {tuple(v["columns"]) for v in verdicts} == {("answer",), ("solution",)}
    assert _audited(verdicts, ["columns_change_between_calls", "a_column_holds_none"]) == []


def test_each_completion_comes_with_its_own_row(tmp_path):
    """The run's own sampler draws each call's rows from its train dataset: a reward that compares each completion
    with its row's column scores every case as labelled (with the rows of other cases, it would reject right
    answers)."""
    rows = [{"id": f"{w}{k}", "class": "c", "completion": f"x{k}", "expected": int(w == "right"),
             "columns": {"answer": f"x{k}" if w == "right" else f"x{k + 1}"}} for k in range(12)
            for w in ("right", "wrong")]
    report = audit_reward("tests.audit.detectors:matches_answer", cases=[_cases(tmp_path, rows)], builtin=False,
                          kind="format", seed=9, variants=0)
    assert report.passed, report.reasons()


#: Detectors audited end to end by default (the reported attack among them); the rest of the battery is slow.
_FAST_DETECTORS = ("log_metric_not_bound_to_a_trainer", "state_not_the_trainers", "ids_do_not_decode_to_completions",
                   "argv_names_audit", "no_training_step_on_the_stack")


def _battery():
    from tests.audit.detectors import PREDICATES

    return [pytest.param(n, marks=() if n in _FAST_DETECTORS else pytest.mark.slow) for n in PREDICATES]


@pytest.mark.parametrize("name", _battery())
def test_a_detector_keyed_on_each_observable_is_flagged(name, tmp_path):
    """The reward an attacker ships: honest when its observable says "audit", 1.0 for every completion (an empty
    one too) otherwise. The audit sees it pay wrong and empty answers."""
    report = audit_reward(f"tests.audit.detectors:detect_{name}", cases=[_cases(tmp_path, _SPY_ROWS)],
                          builtin=False, kind="format", seed=7, variants=0)
    assert not report.passed
    flagged = {o.case.id for o in report.false_positives}
    assert {r["id"] for r in _SPY_ROWS if r["expected"] == 0} <= flagged, report.reasons()


@pytest.mark.slow
def test_the_detector_predicates_read_as_training_in_a_real_run(tmp_path, tiny_model_dir):
    """The reference: ``python train.py`` training an RLVRTrainer on the tiny model with ``detectors.spy`` as its
    reward, started by a shell as a run is. No predicate says "audit" there (each detector would cheat in
    training), nor does any residual one (each is a real observable the audit leaves open) but those of
    :data:`RESIDUAL_IN_A_TINY_RUN` (the reference model is tiny and its process seconds old too), which are only
    documented."""
    import os
    import shlex
    import subprocess
    import sys
    import tempfile

    from tests.audit.detectors import PREDICATES, RESIDUAL, RESIDUAL_IN_A_TINY_RUN, TRAIN_SCRIPT

    where = tempfile.mkdtemp()  # not under pytest's tmp_path, whose name holds this test's
    script, out = os.path.join(where, "train.py"), tmp_path / "verdicts.jsonl"
    with open(script, "w") as f:
        f.write(TRAIN_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, RLVR_SPY_FILE=str(out), PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    command = f"{shlex.quote(sys.executable)} train.py {shlex.quote(str(tiny_model_dir))}; exit $?"  # sh stays
    subprocess.run(["/bin/sh", "-c", command], cwd=where, env=env, check=True, capture_output=True, timeout=600)
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(verdicts) == 3
    assert _audited(verdicts, PREDICATES) == []
    assert _audited(verdicts, RESIDUAL) == sorted(RESIDUAL_IN_A_TINY_RUN)


def test_the_reward_process_has_the_audits_environment(tmp_path, monkeypatch):
    """No variable is added or changed for the reward's process (the audit once set PYTHONPATH) but ``PWD``, which
    its shell sets to its working directory, as a run's has it; its working directory and arguments name no audit,
    and its parent is the shell running its launch script."""
    import os

    out = tmp_path / "process.jsonl"
    monkeypatch.setenv("RLVR_SPY_FILE", str(out))
    report = audit_reward("tests.audit.detectors:process_spy", cases=[_cases(tmp_path, _SPY_ROWS)], builtin=False,
                          kind="format", seed=8, variants=0)
    assert report.passed, report.reasons()
    seen = json.loads(out.read_text().splitlines()[0])
    changed = {k for k, v in os.environ.items() if seen["env"].get(k) != v}
    assert changed <= {"PWD"} and seen["env"]["PWD"] == seen["cwd"]
    assert "audit" not in seen["cwd"] and seen["argv"] == ["train.py"] and seen["sid"] != seen["pid"]
    assert seen["parent"] == ["sh", "train.sh"]


_DRAWN = {}


def _drawn(seed):
    if seed not in _DRAWN:
        texts = [c.completion for c in builtin_corpus("format").cases]
        _DRAWN[seed] = Tokenizer(None, texts, random.Random(seed))
    return _DRAWN[seed]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from([0, 1, 2]), st.text(max_size=300))
def test_property_the_drawn_tokenizers_ids_decode_to_the_text(seed, text):
    """What TRL's trainer does with a completion's ids (``processing_class.decode``) gives the completion back, and
    every id is a token of a vocabulary as large as its ids: a reward cannot tell the drawn tokenizer from a
    released one by decoding or by its size."""
    tok = _drawn(seed)
    hf = tok._tok
    if tok.eos_token in text:
        return  # the end-of-sequence token's text is that token, in any tokenizer
    ids = tok.ids(text)
    assert hf.decode(list(ids), skip_special_tokens=True) == text
    assert all(0 <= i < hf.get_vocab_size() for i in ids)
    assert hf.get_vocab_size() == max(hf.get_vocab().values()) + 1
    assert hf.decode([*ids, tok.eos_id], skip_special_tokens=True) == text
