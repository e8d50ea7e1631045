"""The audit cannot be told apart from training, nor passed by memorising its corpus: calls are GRPO-shaped
batches with token ids and a trainer state, and every case is also sent as seeded metamorphic variants drawn per
run. Rewards written to game the old audit (one case per call, ``trainer_state=None``, byte ids, the shipped
texts) are caught; the built-ins still pass."""

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_rlvr.audit import audit_reward, builtin_corpus
from trl_rlvr.audit.batches import Tokenizer, TrainingRun, plan
from trl_rlvr.audit.variants import variants


def _cases(tmp_path, rows, name="cases.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


#: Shipped math cases of a few classes (the whole corpus takes minutes through boxed_math on a loaded machine).
_CLASSES = ("agreement", "restates_question", "hedging", "equivalent_forms")


def _math_subset(tmp_path):
    rows = [{"id": c.id, "class": c.cls, "completion": c.completion, "expected": c.expected, "columns": c.columns}
            for c in builtin_corpus("math_answer").cases if c.cls in _CLASSES]
    return _cases(tmp_path, rows, "math.jsonl")


def _audit(name, tmp_path, **kwargs):
    return audit_reward(name, cases=[_math_subset(tmp_path)], builtin=False, kind="math_answer", **kwargs)


def test_a_reward_that_memorised_the_shipped_cases_is_caught_by_the_variants(tmp_path):
    """It scores every shipped case as labelled and pays 1.0 for anything else: the variants are texts it has not
    seen, so the wrong ones among them are accepted."""
    report = _audit("tests.harness.audit_rewards:memorised_corpus", tmp_path, seed=7)
    assert not report.passed
    assert report.false_positives and all("~v" in o.case.id for o in report.false_positives)
    # without variants the same reward passes: the variants are what catches it
    assert _audit("tests.harness.audit_rewards:memorised_corpus", tmp_path, seed=7, variants=0).passed


@pytest.mark.parametrize("name", ["honest_without_trainer_state", "honest_one_at_a_time", "honest_on_byte_ids"])
def test_a_reward_honest_only_in_the_old_audits_call_is_caught(name, tmp_path):
    report = _audit(f"tests.harness.audit_rewards:{name}", tmp_path, seed=3, variants=1)
    assert not report.passed and len(report.false_positives) >= 20


def test_the_honest_built_in_passes_the_same_audit(tmp_path):
    """The same cases and seed: boxed_math itself passes where the gaming rewards above fail."""
    report = _audit("boxed_math", tmp_path, seed=3, variants=1)
    assert report.passed, report.reasons()


def test_calls_carry_groups_token_ids_and_a_trainer_state(tmp_path):
    rows = [{"id": f"r{k}", "class": "c", "completion": "right", "expected": 1, "columns": {"answer": str(k % 3)}}
            for k in range(7)] + [{"id": "w", "class": "c", "completion": "wrong", "expected": 0}]
    report = audit_reward("tests.harness.audit_rewards:shape_of_training", cases=[_cases(tmp_path, rows)],
                          builtin=False, kind="format", seed=1, variants=0)  # the words themselves, as written
    assert report.passed, report.reasons()
    assert report.to_json()["calls"]["seed"] == 1


def test_the_seed_draws_the_run():
    a = audit_reward("think_format", seed=11).to_json()
    b = audit_reward("think_format", seed=11).to_json()
    c = audit_reward("think_format", seed=12).to_json()
    ids = [sorted(e["id"] for e in j["case_results"]) for j in (a, b, c)]
    assert ids[0] == ids[1] and a["calls"]["seed"] == 11 and a["variant_cases"] > 100
    assert a["passed"] and c["passed"]


def _variants_of(kind, seed, n=3):
    rng = random.Random(seed)
    return [(c, variants(c, kind, rng, n)) for c in builtin_corpus(kind).cases]


@pytest.mark.parametrize("kind", ["math_answer", "format", "code"])
def test_variants_are_new_texts_with_the_case_label(kind):
    for case, found in _variants_of(kind, 5):
        texts = [v.completion for v in found]
        assert case.completion not in texts and len(set(texts)) == len(texts)
        for v in found:
            assert (v.expected, v.cls, v.columns, v.prompt) == (case.expected, case.cls, case.columns, case.prompt)
            assert v.id.startswith(case.id + "~v") and v.note.startswith(f"variant of {case.id}")
    assert _variants_of(kind, 5) == _variants_of(kind, 5)
    assert [v for _, vs in _variants_of(kind, 5) for v in vs] != [v for _, vs in _variants_of(kind, 6) for v in vs]


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 4))
def test_property_every_case_is_planned_once_in_groups_of_one_row(seed, group_size, groups_per_call):
    rng = random.Random(seed)
    cases = list(builtin_corpus("math_answer").cases[:30])
    groups = [[c, *variants(c, "math_answer", rng, 2)] for c in cases]
    calls = plan(groups, Tokenizer(None, [c.completion for c in cases], rng), rng, group_size=group_size,
                 groups_per_call=groups_per_call, kind="math_answer")
    sent = {it.case.id for call in calls for it in call.items}
    assert sent == {c.id for g in groups for c in g}
    run = TrainingRun(rng, len(calls), group_size * groups_per_call, group_size, "boxed_math")
    calls = [run.prepare(call) for call in calls]  # as the runner makes them: the ids as the policy generates them
    for call in calls:
        assert len(call.items) == group_size * groups_per_call  # every call of a run has one size
        assert all(it.prompt_text for it in call.items)  # no run has empty prompts
        assert all(it.ids and list(it.ids) != list(it.case.completion.encode()) for it in call.items
                   if it.case.completion)
        assert len({tuple(sorted(it.case.columns)) for it in call.items}) == 1  # one dataset, one set of columns
