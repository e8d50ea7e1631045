"""``None`` means the machinery failed, proven each time: how a verifying reward tells a failure of its own checking
machinery from a wrong answer (``boxed_math``'s ``BoxedMathReward.attribute``, ``code_sandbox``'s
``CodeSandboxReward.attribute``).

A job the machinery *lost* (its worker died under it, or no worker could start to take it) is not yet judged. It
runs again; the pools replace a failed worker, so the re-run is on a fresh one. A job lost again is decided by a
control job (one that passes on any working machinery) run right after:

* the control passes: the machinery works, so this job broke its worker twice; it is the answer's failure
  (scored 0, counted with the reward's errors);
* the control fails too: the machinery is failing; the job was never judged (scored ``None``: TRL leaves it out of
  its group's baseline and gives it no advantage, counted in ``<reward>/infra_errors``).

Nothing else makes a job ``None``: a deadline (its own, or a batch's) scores 0, and what an answer prints, raises
or returns is never read as the machinery's failure. Every step is bounded by the pools' own start and task
deadlines, so a machine where no worker ever starts costs three bounded attempts and the reward returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")


def reproduce(
    run: Callable[[list[Job]], Sequence[Outcome]],
    jobs: Sequence[Job],
    lost: Callable[[Outcome], bool],
    control: Job,
    passed: Callable[[Outcome], bool],
) -> tuple[list[Outcome], dict[int, bool]]:
    """``run(jobs)``, the jobs it ``lost`` run again, and the ``control`` job after those lost twice.

    Returns ``(outcomes, machinery_failed)``: ``outcomes[k]`` is the last outcome of ``jobs[k]``;
    ``machinery_failed`` maps each job lost twice to whether the control failed too (True: the machinery failed,
    not judged; False: the control ``passed``, the job broke its worker twice)."""
    outcomes = list(run(list(jobs)))
    again = [k for k, o in enumerate(outcomes) if lost(o)]
    if again:
        for k, o in zip(again, run([jobs[k] for k in again])):
            outcomes[k] = o
    twice = [k for k, o in enumerate(outcomes) if lost(o)]
    if not twice:
        return outcomes, {}
    control_passed = passed(run([control])[0])
    return outcomes, {k: not control_passed for k in twice}
