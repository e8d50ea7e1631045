"""``boxed_math``: 1.0 when the final boxed answer equals the gold (checked by math-verify), else 0.0.

The answer is the LAST top-level ``\\boxed{...}`` (or ``\\fbox{...}``, ...) of the answer part: the text after the last
``</think>`` when the completion has one (reasoning opened with ``<think>`` and never closed gives no
answer), the whole completion otherwise. The gold (dataset column ``answer``, else ``solution``; see
``gold_column``) may be a bare answer (``\\frac{1}{2}``, ``3,\\!250``, ``x \\in [0,1)``) or a whole reference
solution, whose last box is then the gold.

Against reward hacking:

* hedging scores 0: every box of the answer part, at any depth and drawn by any box command (``\\boxed``,
  ``\\fbox``, ``\\framebox``, ``\\colorbox``, ``\\fcolorbox``), must hold an answer equal to the gold, so
  boxing several different candidates gets nothing, while the same answer boxed twice (in any form) and
  layout boxes (empty, spacing only, ``\\phantom{..}``) do not count against a right answer;
* a box must state ONE answer, read whole (:mod:`reward_plugins.boxed_math.answer_form`): text that is not part of the
  answer (``\\boxed{3 \\text{ (or 4)}}``), an equation or approximation asserting a second value
  (``\\boxed{3 = 4}``, ``\\boxed{3 \\approx 4}``), numerals side by side (``\\boxed{3 \\; 4}``) or a command
  the parser does not implement score 0, and a box is never scored from a fragment of it;
* a boxed list that merely contains the gold (``\\boxed{1, 2, 3}`` for gold ``2``) scores 0 (math-verify
  compares the set with the number);
* no boxed answer scores 0, unless ``answer_line=True`` and the last line reads ``The answer is: X``;
* untrusted output never crashes or hangs training: every check runs in a worker process with a hard
  deadline (``timeout`` CPU seconds, at most 5x that in wall seconds) that works in any thread; a box
  longer than ``max_answer_chars``, an unbalanced box, a check that times out or raises all score 0 and
  are counted in the metrics ``boxed_math/{timeouts,errors,rejected}`` (through TRL's ``log_metric`` when
  the trainer provides it), with ``no_box``, ``hedged`` (two answers) and ``unparsed`` (a box the rules do not
  read as one answer);
* every worker runs under an address-space bound (``memory_limit_mb``, default 1024 MiB per worker, so the
  pool takes at most ``num_workers`` x that plus the zygote's ~70 MB): a check that runs out of it (an answer
  like ``(x^2+2x+1)^{50000}`` against ``(x+1)^{100000}`` expands into ever larger coefficients) scores 0, is
  counted in ``boxed_math/oom``, and its worker is replaced;
* a call interrupted while checks are in flight (``KeyboardInterrupt``, an exception raised by a signal
  handler or a trainer's timeout) leaves no reply behind for the next call: each reply carries the id of
  the task it answers, and the workers still busy are replaced.

Answers equal up to ``\\text{}`` wrapping, spacing and case of text are equal (``\\text{4:30 p.m.}``,
``4:30\\text{ p.m.}``, ``4:30 \\text{PM}``).

A gold that math-verify cannot parse gives ``None`` (TRL then ignores this reward for that row), counted as
``boxed_math/bad_gold``. So does an answer the checking machinery failed to check, and only when that is proven each
time: its check was lost (its worker died, or no worker could start), lost again on a fresh worker, and a control
check failed too; counted as ``boxed_math/infra_errors``: it is not a wrong answer (``BoxedMathReward.attribute``).
Workers that could not start are counted in ``boxed_math/worker_start_failures``; the reward never raises for them.

Speed: identical (gold, answer) checks within a batch are done once; a group's answers go to the same
worker, which parses their gold once; the batch runs across ``num_workers`` long-lived processes (default:
the usable cores, at most 8), forked from a zygote process that imports and warms up math-verify once, in
the background from the moment the reward function is built (``prestart``); a check's deadline starts only
when a warm worker takes it. A wrong symbolic answer (``x - 2`` for ``x^2+33x-33``) is recognized by
evaluating both at probe points, skipping sympy's ``simplify``; math-verify decides every other case.

Combining with ``think_format``: ``reward_funcs=["think_format", "boxed_math"]`` rewards the format and the
answer separately; boxed_math reads only the part after ``</think>``, so a box written while thinking never
counts as the answer (use the same ``think_tag`` for both).
"""

from __future__ import annotations

import logging
from collections import Counter

from reward_plugins._infra import reproduce
from reward_plugins._text import answer_part, check_tag_name, column, completion_text, log_counts
from reward_plugins.boxed_math.answer_form import answer_key
from reward_plugins.boxed_math.boxes import answer_line, find_boxes, is_layout, unwrap_boxes
from reward_plugins.boxed_math.question import Question, prompt_text, read_question

log = logging.getLogger(__package__)
_MAX_DISTINCT_BOXES = 8  # more distinct boxes than this is hedging, whatever they hold
#: The smallest ``memory_limit_mb``: a warmed worker maps about 70 MB and normal checks peak well below this.
MIN_MEMORY_LIMIT_MB = 256


class BoxedMathReward:
    """The reward function built by :func:`boxed_math`.

    A callable class rather than a closure, as TRL's ``get_soft_overlong_punishment``: it must pickle (TRL's async
    rollout worker and ``datasets.map`` ship reward functions to other processes) and a pickle carries only its
    options (the worker pool is per process, created on first use); voting (``extract_answer``, ``same_answers``)
    reads the answer as the reward does. The options and their defaults are the factory's.
    """

    #: Scores correctness, not form: RLVRTrainer's default ``success_reward`` (rlvr/accuracy).
    verifies_correctness = True
    reward_kind = "math_answer"  # the corpus `trl-rlvr rewards audit` runs (docs/auditing_rewards.md)
    __name__ = "boxed_math"  # TRL logs rewards/boxed_math/mean

    def __init__(self, *, gold_column: str | None, timeout: float, batch_timeout: float | None, answer_line: bool,
                 think_tag: str, max_answer_chars: int, num_workers: int | None, prestart: bool, prefilled: bool,
                 memory_limit_mb: int, relative_tolerance: float | None):  # fmt: skip
        if not timeout > 0:
            raise ValueError(f"boxed_math: timeout must be > 0 seconds, got {timeout!r}")
        if batch_timeout is not None and not batch_timeout > 0:
            raise ValueError(f"boxed_math: batch_timeout must be > 0 seconds or None, got {batch_timeout!r}")
        if not isinstance(max_answer_chars, int) or max_answer_chars <= 0:
            raise ValueError(f"boxed_math: max_answer_chars must be a positive integer, got {max_answer_chars!r}")
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers <= 0):
            raise ValueError(f"boxed_math: num_workers must be a positive integer or None, got {num_workers!r}")
        check_tag_name("boxed_math", "think_tag", think_tag)
        if (not isinstance(memory_limit_mb, int) or isinstance(memory_limit_mb, bool)
                or memory_limit_mb < MIN_MEMORY_LIMIT_MB):
            raise ValueError(
                f"boxed_math: memory_limit_mb must be an integer >= {MIN_MEMORY_LIMIT_MB} (MiB of address space per "
                f"worker), got {memory_limit_mb!r}"
            )
        if relative_tolerance is not None and (isinstance(relative_tolerance, bool)
                                               or not isinstance(relative_tolerance, (int, float))
                                               or not 0 < relative_tolerance < 1):
            raise ValueError(f"boxed_math: relative_tolerance must be a number in (0, 1) or None, got "
                             f"{relative_tolerance!r}")
        self.relative_tolerance = None if relative_tolerance is None else float(relative_tolerance)
        self.gold_column = gold_column
        self.timeout = float(timeout)
        self.batch_timeout = batch_timeout
        self.answer_line = bool(answer_line)
        self.think_tag = think_tag
        self.prefilled = bool(prefilled)
        self.max_answer_chars = max_answer_chars
        self.num_workers = num_workers
        self.memory_limit_mb = memory_limit_mb
        if prestart:  # workers import and warm up math-verify while the trainer loads the model
            self._pool().start()

    @property
    def required_columns(self) -> tuple:
        """The dataset column(s) holding the gold, checked before the model loads (trl_rlvr.checks)."""
        return (self.gold_column,) if self.gold_column else (("answer", "solution"),)

    def __repr__(self) -> str:
        return f"boxed_math(gold_column={self.gold_column!r}, timeout={self.timeout}, answer_line={self.answer_line})"

    # -- one answer -> the candidates to check (pure text, in this process) --------------------------------
    def candidates(self, text: str) -> tuple[str, ...] | str:
        """The distinct boxed answers of ``text`` (final last), or the reason it scores 0 without a check.

        Every box counts, also one inside another (``\\boxed{\\boxed{3}} \\boxed{4}`` holds 3 three times and 4
        once); the final answer is the last top-level box, with the boxes inside it unwrapped."""
        if self.prefilled:  # the prompt ended with <think>: the completion starts inside the reasoning
            text = f"<{self.think_tag}>" + text
        part = answer_part(text, f"</{self.think_tag}>", f"<{self.think_tag}>")
        if part is None:
            return "no_box"
        boxes = find_boxes(part, self.max_answer_chars)
        if any(b.content is None for b in boxes):
            return "rejected"
        contents, final = [], None
        for box in boxes:
            unwrapped = unwrap_boxes(box.content, self.max_answer_chars)
            if unwrapped is None:
                return "rejected"
            outer, inner = unwrapped
            answers = [c.strip() for c in (outer, *inner) if not is_layout(c)]
            contents += answers
            if not is_layout(outer):
                final = outer.strip()
        if final is None and self.answer_line and not contents:
            final = answer_line(part, self.max_answer_chars)
            contents = [final] if final else []
        if final is None:
            return "hedged" if contents else "no_box"  # boxes inside a layout box: answers, none of them final
        seen: dict[str, str] = {}
        for c in contents:
            seen.setdefault(answer_key(c), c)
        final_key = answer_key(final)
        others = [c for k, c in seen.items() if k != final_key]
        if len(others) >= _MAX_DISTINCT_BOXES:
            return "hedged"
        return (*others, final)

    def is_final_answer(self, text: str) -> bool:
        """Whether one turn's text gives a final answer, right or wrong: a box this reward reads as an answer (an
        unreadable or hedged box is an answer too, a bad one); no box is none. RLVRTrainer's ``void_turn_action``
        asks it of each assistant turn (:func:`trl_rlvr.algorithms.multi_turn.void_turn_rollouts`)."""
        return self.candidates(text) != "no_box"

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float | None]:
        if completions is None:
            raise TypeError("boxed_math: called without completions")
        n = len(completions)
        names = [self.gold_column] if self.gold_column else ["answer", "solution"]
        golds = column(kwargs, names, n)
        if golds is None:
            raise ValueError(
                f"boxed_math: no gold column {' or '.join(map(repr, names))} among the reward kwargs "
                f"({sorted(k for k in kwargs if k not in ('trainer_state', 'log_extra', 'log_metric'))}); "
                "set the option gold_column"
            )
        counts: Counter[str] = Counter()
        rewards: list[float | None] = [0.0] * n
        jobs: dict[tuple, list[int]] = {}
        prompts = list(prompts) if prompts is not None else [None] * n
        if len(prompts) != n:
            raise ValueError(f"boxed_math: {len(prompts)} prompts for {n} completions")
        questions: dict[str, Question] = {}  # a group shares its prompt: read once
        for i, (completion, gold) in enumerate(zip(completions, golds)):
            if gold is None or not str(gold).strip():
                rewards[i] = None
                counts["bad_gold"] += 1
                continue
            try:
                cands = self.candidates(completion_text(completion))
            except Exception:  # noqa: BLE001 - untrusted text never crashes the reward
                cands = "errors"
            if isinstance(cands, str):
                counts[cands] += 1
                continue
            text = prompt_text(prompts[i])
            if text not in questions:
                questions[text] = read_question(text)
            jobs.setdefault((str(gold), cands, questions[text]), []).append(i)

        if jobs:
            tasks = [(gold, (gold, cands, question, self.relative_tolerance)) for gold, cands, question in jobs]
            pool = self._pool()
            failed_starts = pool.start_failures
            results = self.attribute(tasks)
            counts["worker_start_failures"] = pool.start_failures - failed_starts
            for (status, value), rows in zip(results, jobs.values()):
                key = {"ok": value, "timeout": "timeouts", "skipped": "timeouts", "oom": "oom",
                       "infra": "infra_errors"}.get(status, "errors")
                counts[key] += len(rows)
                for i in rows:
                    rewards[i] = 1.0 if key == "correct" else None if key in ("bad_gold", "infra_errors") else 0.0
            if counts["infra_errors"]:
                log.warning("boxed_math: %d of %d answers not checked: the checking workers failed (scored None, "
                            "counted in boxed_math/infra_errors)", counts["infra_errors"], n)

        log_counts(
            kwargs,
            self.__name__,
            {k: counts.get(k, 0)
             for k in ("timeouts", "oom", "errors", "rejected", "no_box", "hedged", "unparsed", "unevaluated",
                       "bad_gold", "infra_errors", "worker_start_failures")},
        )
        return rewards

    # -- majority voting (maj@k; the interface of trl_rlvr.rewards.voting) -------------------------------------------
    def extract_answer(self, completion) -> str | None:
        """The final boxed answer, read as the reward reads it (after ``</think>``, last top-level box); ``None``
        when the reward would find no answer (no box, unclosed reasoning, an over-long or unbalanced box)."""
        try:
            cands = self.candidates(completion_text(completion))
        except Exception:  # noqa: BLE001 - untrusted text: no answer
            return None
        return None if isinstance(cands, str) else cands[-1]

    def same_answers(self, pairs) -> list[bool]:
        """Whether each pair of extracted answers is one answer for the checker: each, taken as the gold,
        accepts the other (both ways, so that neither side is read by the gold's lenient parse alone). Equal
        :func:`answer_key` needs no check; the rest run in the deadline-bounded workers (a timeout: not same)."""
        out = [answer_key(a) == answer_key(b) for a, b in pairs]
        todo = [i for i, same in enumerate(out) if not same]
        tasks = [(a, (a, (b,))) for i in todo for a, b in (pairs[i], pairs[i][::-1])]
        results = self._run(tasks) if tasks else []
        for n, i in enumerate(todo):
            out[i] = all(r == ("ok", "correct") for r in results[2 * n : 2 * n + 2])
        return out

    def same_answer(self, a: str, b: str) -> bool:
        """:meth:`same_answers` for one pair."""
        return self.same_answers([(a, b)])[0]

    def _pool(self):
        from reward_plugins.boxed_math.math_check import check, warm
        from reward_plugins.boxed_math.pool import get_pool

        return get_pool(check, self.num_workers, warmup=warm, memory_limit=self.memory_limit_mb << 20)

    def _run(self, tasks):
        return self._pool().map(tasks, self.timeout, self.batch_timeout)

    #: The control check of :meth:`attribute`: an answer equal to its gold on any working worker.
    CONTROL = ("2", ("2",))
    #: The pool's statuses of a check it lost (its worker died under it; no worker could start to take it).
    LOST = ("died", "unstarted")

    def attribute(self, tasks):
        """The pool's results for ``tasks``, with each check the pool lost attributed to the checking machinery
        (``("infra", status)``: not checked, scored ``None``) or to the answer, by reproduction
        (:func:`reward_plugins._infra.reproduce`), never by an error's text: a lost check (:attr:`LOST`) runs again
        on a fresh worker; lost again, a control check (:attr:`CONTROL`) runs: when it passes, the workers work
        and this answer broke its worker twice (an error, scored 0, as a check that raises); when it fails too,
        the machinery is failing.

        Everything else is the answer's and scored: a check that times out, runs out of memory or raises scores
        0; so does one that ``batch_timeout`` left unstarted (``skipped``): the batch's answers used the budget up,
        which of them go unchecked is chance, and ``None`` for them would let costly answers escape their penalty.
        A slow start of the workers only delays checks (a deadline starts when a warm worker takes its check)."""
        gold, cands = self.CONTROL
        control = (gold, (gold, cands, read_question(""), None))
        results, machinery_failed = reproduce(self._run, tasks, lambda r: r[0] in self.LOST, control,
                                              lambda r: r == ("ok", "correct"))
        for k, failed in machinery_failed.items():
            lost = results[k][0]
            results[k] = ("infra", lost) if failed else ("error", f"{lost} twice while the control check passed")
        return results

    # pickling: only the options travel (the instance holds nothing else); the worker pool is per process and
    # created on first use


def boxed_math(
    *,
    gold_column: str | None = None,
    timeout: float = 5.0,
    batch_timeout: float | None = None,
    answer_line: bool = False,
    think_tag: str = "think",
    max_answer_chars: int = 2000,
    num_workers: int | None = None,
    prestart: bool = True,
    prefilled: bool = False,
    memory_limit_mb: int = 1024,
    relative_tolerance: float | None = None,
) -> BoxedMathReward:
    """Math answer correctness: the last \\boxed{} after the reasoning, checked against the gold by math-verify.

    Args:
        gold_column: dataset column holding the gold answer or reference solution
            (default: ``answer``, else ``solution``).
        timeout: hard deadline for checking one answer, in CPU seconds of the worker (wall-clock cap: 5x);
            past it the worker is killed and replaced and the answer scores 0.
        batch_timeout: optional deadline in seconds for a whole call; answers not checked by then score 0.
        answer_line: also accept a final ``The answer is: X`` line when the answer part has no box.
        think_tag: name of the reasoning tag (``<think>``); the answer is read after ``</think_tag>``.
        max_answer_chars: a box longer than this scores 0 without a check.
        num_workers: worker processes (default: usable cores, at most 8).
        prestart: start the workers now (they import and warm up math-verify, a few seconds, in the
            background) rather than at the first call.
        prefilled: the prompt already ends with ``<think>`` (the assistant turn is pre-filled), so the
            completion starts inside the reasoning: without ``</think>`` there is no answer (scores 0).
        memory_limit_mb: address-space bound of each worker process in MiB (default 1024, at least 256); a
            check that runs out of it scores 0 (metric ``boxed_math/oom``) and its worker is replaced.
        relative_tolerance: accept a number within this relative distance of a numeric gold (for golds that are
            measurements); default ``None``: an exact gold needs an exact answer, or the gold rounded to the
            precision the problem states (docs/rewards.md, "Exact answers").
    """
    return BoxedMathReward(
        gold_column=gold_column, timeout=timeout, batch_timeout=batch_timeout, answer_line=answer_line,
        think_tag=think_tag, max_answer_chars=max_answer_chars, num_workers=num_workers, prestart=prestart,
        prefilled=prefilled, memory_limit_mb=memory_limit_mb, relative_tolerance=relative_tolerance,
    )  # fmt: skip


#: Ready-made, with the default options, for TRL's own CLI: ``trl grpo --reward_funcs reward_plugins.boxed_math.reward``
#: (its workers start at the first call).
reward = boxed_math(prestart=False)
