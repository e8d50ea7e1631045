"""Run cases through a reward in a child process, in calls shaped like training's, each under a deadline.

The reward is built and called in a child process (:mod:`trl_rlvr.audit._child`, run as a script copied into the
audit's scratch directory, its working directory, by a shell script there: ``sh train.sh``) in its own process
group, by a training run (one optimizer step per call). The cases go in calls planned by
:mod:`trl_rlvr.audit.batches` (GRPO-shaped groups, several per call, token ids, the run's settings); a call has
``deadline`` seconds per completion. A call that fails (the reward raised, its process died, or it ran past the
deadline: then the whole group is killed and a fresh child started) is run again one completion at a time (a step of
it repeated: the run's trainer scores whole steps), so that each case gets its own status: ``error`` (an exception,
``SystemExit`` included), ``crash`` (the process died: ``os._exit``, a segfault) or ``timeout``. A call that fails
while every one of its completions alone scores is reported as an error of its own (class ``batching``): a reward
must score the calls training makes. Nothing the reward does can stop the audit. Every fresh child first scores a
warm-up call (a call of the run of the corpus's plain cases) under the startup deadline, so that imports and worker
pools are not charged to a case.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import pickle
import re
import selectors
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trl_rlvr.audit.batches import Call, TrainingRun, call_columns, row_columns, step_rows
from trl_rlvr.audit.cases import Case

_MAX_REPLY = 1 << 20
_PROGRESS = re.compile(r"\d+%\|.*\| *\d+/\d+ \[")  # the trainer's progress bar, on the process's stderr
_STDERR_TAIL = 2000


class RewardStartError(RuntimeError):
    """The reward could not be built (unknown name, bad option, import error) or its process did not start."""


@dataclass(frozen=True)
class Outcome:
    """What one case gave: ``status`` is ``scored`` (``score`` a float or ``None``), ``error`` (the reward raised
    or returned something that is not one score), ``crash`` (its process died) or ``timeout`` (past the deadline)."""

    case: Case
    status: str
    score: float | None
    seconds: float
    detail: str = ""


#: The name of the reward process's script in the scratch directory (what ``sys.argv`` and ``__main__`` show it).
SCRIPT = "train.py"
#: The shell script that starts it (its parent process, as a run's launch script is): ``sh train.sh``.
LAUNCHER = "train.sh"


def _setup(reward: str | Callable, options: dict, messages: bool, workdir: str) -> dict:
    # the parent's import path, so that a module:function (or a pickled function) imports there as it does here
    path = [p for p in sys.path if p and os.path.isdir(p)]
    setup: dict[str, Any] = {"options": options, "messages": messages, "workdir": workdir, "path": path}
    if isinstance(reward, str):
        setup["reward"] = reward
    else:
        if options:
            raise ValueError("options apply to a reward given by its registered name")
        try:
            setup["pickled"] = base64.b64encode(pickle.dumps(reward)).decode()
        except Exception as e:
            raise ValueError(f"the reward {reward!r} cannot be pickled for the audit's child process ({e}); "
                             "give it as a registered name or module:function") from e
        setup["reward"] = getattr(reward, "__name__", repr(reward))
    return setup


class RewardProcess:
    """One child process holding the built reward; :meth:`call` scores one case under a deadline."""

    def __init__(self, setup: dict, startup_deadline: float):
        self._setup = setup
        self.info: dict = {}
        self._stderr: collections.deque[bytes] = collections.deque()
        self._stderr_len = 0
        self._buf = b""
        self._next = 0
        self._closed = False
        # started by a shell script (``sh train.sh``, which runs ``python train.py`` and waits for it, as a run's
        # launch script does), the two in a process group of their own (killed whole), in the audit's session
        self.proc = subprocess.Popen(
            ["sh", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            process_group=0, cwd=setup["workdir"],
        )
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            self.proc.stdin.write((json.dumps(setup) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass
        status, reply = self._reply(time.monotonic() + startup_deadline)
        if status != "ok" or "fatal" in reply or not reply.get("ready"):
            self.close()
            if status == "ok" and "fatal" in reply:
                raise RewardStartError(reply["fatal"])
            raise RewardStartError(f"the reward's process did not start ({status}: {reply or self.stderr_tail()})")
        self.info = reply

    def _drain_stderr(self):
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):
            self._stderr.append(chunk)
            self._stderr_len += len(chunk)
            while self._stderr_len - len(self._stderr[0]) > _STDERR_TAIL and len(self._stderr) > 1:
                self._stderr_len -= len(self._stderr.popleft())

    def stderr_tail(self) -> str:
        text = b"".join(self._stderr).decode(errors="replace").strip()
        return text[-_STDERR_TAIL:]

    def _reply(self, deadline: float) -> tuple[str, dict]:
        """("ok", reply) | ("timeout", {}) | ("crash", {}) | ("protocol", {}): the next line from the child."""
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", {}
            if not self._sel.select(timeout=min(left, 0.25)):
                if self.proc.poll() is not None:  # dead, though a process it forked may hold the pipe open
                    return "crash", {}
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return "crash", {}
            self._buf += chunk
            if len(self._buf) > _MAX_REPLY:
                return "protocol", {}
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            return "protocol", {}
        return ("ok", reply) if isinstance(reply, dict) else ("protocol", {})

    def call(self, call: Call, deadline: float, context: dict | None = None,
             steps: list | None = None) -> tuple[str, list | None, str]:
        """(status, scores, detail) for one call; after any status but ``scored``/``error`` the process is gone.
        ``context`` (the run's settings and rows, for the process's trainer) goes with its first request;
        ``steps`` (the rows of this call's step and of the steps planned after it) with a request that starts a
        run (the process's first, and the first after an error: the process starts its run again)."""
        self._next += 1
        request = {"i": self._next, **(context or {} if self._next == 1 else {}),
                   **({"steps": steps} if steps is not None else {}),
                   "items": [{"completion": it.case.completion, "prompt": it.prompt_text, "columns": it.case.columns,
                              "ids": it.ids} for it in call.items]}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return "crash", None, self._death()
        status, reply = self._reply(time.monotonic() + deadline)
        if status == "ok" and reply.get("i") == self._next and ("scores" in reply or "error" in reply):
            if "error" in reply:
                return "error", None, str(reply["error"])
            scores = reply["scores"]
            if isinstance(scores, list) and len(scores) == len(call.items) and all(
                    s is None or isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
                return "scored", scores, ""
        self.close()
        if status == "timeout":
            return "timeout", None, f"no score within {deadline:g} s"
        if status == "crash":
            return "crash", None, self._death()
        return "crash", None, "the reward's process wrote something else than its reply on the audit's channel"

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code > 128 and code - 128 in signal.valid_signals():  # the shell's 128 + N
            code = 128 - code
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
        tail = [line for line in self.stderr_tail().splitlines() if line.strip() and not _PROGRESS.search(line)][-1:] or [""]
        return f"the reward's process died ({how}) {tail[0][:200]}".strip()

    def close(self, graceful: bool = False):
        """Kill the process group. ``graceful``: first close the requests, so that the child returns from its loop
        and runs its exit handlers (worker pools shut down), waiting up to 10 s."""
        if self._closed:
            return
        self._closed = True
        if graceful and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:  # not reaped yet, so its group id cannot have been reused
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._sel.close()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _worst(found: list[Outcome]) -> list[Outcome]:
    """One outcome per case: a failure if any, else the highest score of a case that must be rejected and the
    lowest of one that must be accepted (``None`` lowest, but highest for a wrong answer a score is due for:
    ``Case.must_score``): a reward must score a repeated completion alike."""
    by_id: dict[str, list[Outcome]] = {}
    for o in found:
        by_id.setdefault(o.case.id, []).append(o)
    out = []
    for group in by_id.values():
        failed = [o for o in group if o.status != "scored"]
        if failed:
            out.append(failed[0])
            continue
        def key(o: Outcome) -> float:  # None: the worst of a wrong answer a score is due for (an escape)
            if o.score is None:
                return float("inf") if o.case.must_score and o.case.expected == 0 else -1.0
            return o.score

        out.append(max(group, key=key) if group[0].case.expected == 0 else min(group, key=key))
    return out


class Runner:
    """The reward in a child process, and the cases through it: ``with Runner(...) as r: r.run(cases)``.

    Raises :class:`RewardStartError` when the reward cannot be built. ``info`` is what the child reported
    (``name``, the declared ``kind``); ``startup_seconds`` the time each fresh child took to start and score its
    warm-up case (one entry per child: more than one means a case killed or hung the previous one)."""

    def __init__(self, reward: str | Callable, *, options: dict | None = None, messages: bool = False,
                 deadline: float = 30.0, startup_deadline: float = 120.0):
        if not deadline > 0 or not startup_deadline > 0:
            raise ValueError(f"deadlines must be > 0 seconds, got {deadline!r} and {startup_deadline!r}")
        self.deadline, self.startup_deadline = float(deadline), float(startup_deadline)
        self._tmp = tempfile.TemporaryDirectory()
        self._setup = _setup(reward, dict(options or {}), messages, self._tmp.name)
        with open(os.path.join(self._tmp.name, SCRIPT), "w") as f:
            f.write(Path(__file__).with_name("_child.py").read_text())
        with open(os.path.join(self._tmp.name, LAUNCHER), "w") as f:
            f.write(f"#!/bin/sh\n{shlex.quote(sys.executable)} {SCRIPT}\n")
        self.context: dict | None = None  # set before the first call: {"run": settings, "rows": [...]}
        self.startup_seconds: list[float] = []
        self._t0 = time.monotonic()
        try:
            self._proc: RewardProcess | None = RewardProcess(self._setup, self.startup_deadline)
        except BaseException:
            self._tmp.cleanup()
            raise
        self.info = dict(self._proc.info)
        self._warm = False
        self._new_run = True  # the next request starts the process's run (it carries the steps planned)
        self._columns: tuple | None = None  # the columns of the process's dataset (of its calls)
        self._run: TrainingRun | None = None
        self._warmups: dict[tuple, Call] = {}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(graceful=exc_type is None)  # interrupted (Ctrl-C) or failed: no waiting for the case to end

    def _ready(self, upcoming: list[Call]) -> RewardProcess:
        """The reward's process, started and warmed: a fresh one first scores the warm-up call (a call of the run
        like the others, of plain cases: its step passes, its scores are not reported) under the startup deadline,
        so that imports and worker pools are not charged to a case. ``upcoming``: the calls to be sent next."""
        if self._proc is None or self._proc.proc.poll() is not None:
            self._t0 = time.monotonic()
            self._proc = RewardProcess(self._setup, self.startup_deadline)
            self._warm, self._new_run = False, True
        if not self._warm:
            self._warm = True
            warmup = self._warmups.get(self._columns)
            if warmup is not None:
                self._send(self._stated(warmup), self.startup_deadline, upcoming)
            self.startup_seconds.append(time.monotonic() - self._t0)
            if self._proc.proc.poll() is not None:  # the warm-up killed it: a fresh one, not warmed again
                self._t0 = time.monotonic()
                self._proc = RewardProcess(self._setup, self.startup_deadline)
                self._new_run = True
        return self._proc

    def _send(self, call: Call, deadline: float, later: list[Call]) -> tuple[str, list | None, str]:
        """Send ``call``; a request that starts the process's run carries the rows of its step and of ``later``'s
        with its columns, the calls planned after it (the run's train dataset draws them in that order)."""
        group = self._run.group_size if self._run is not None else 1
        steps = [step_rows(c, group) for c in (call, *later) if call_columns(c) == self._columns]
        context = None if self.context is None else {  # the process's dataset: the rows with its columns
            **self.context, "rows": [r for r in self.context.get("rows", []) if row_columns(r) == self._columns]}
        status, scores, detail = self._proc.call(call, deadline, context, steps if self._new_run else None)
        self._new_run = status != "scored"  # after an error the process starts its run again; else it is a new one
        return status, scores, detail

    def _stated(self, call: Call) -> Call:
        """``call`` with the run's completion ids (unchanged without a run)."""
        return call if self._run is None else self._run.prepare(call)

    def _call(self, call: Call, later: list[Call], completions: int | None = None) -> tuple[str, list | None, str, float]:
        """Send ``call`` under the deadline times its completions (``completions``: as many as that, for a step
        of one completion in every group, charged as one group). A call with other columns than the process's
        goes to a fresh process: a run trains on one dataset, with one set of columns, so every call a process
        gets passes the reward the same keyword arguments, as a training run's calls do."""
        columns = call_columns(call)
        if columns != self._columns:
            if self._proc is not None and self._columns is not None:
                self._proc.close(graceful=True)
                self._proc = None
            self._columns = columns
        self._ready([call, *later])
        t = time.monotonic()
        deadline = self.deadline * (completions or len(call.items))
        status, scores, detail = self._send(self._stated(call), deadline, later)
        return status, scores, detail, time.monotonic() - t

    def run(self, calls: Iterable[Call], warmups: Mapping[tuple, Call] | None = None,
            on_case: Callable[[Outcome], None] | None = None, training: TrainingRun | None = None) -> list[Outcome]:
        """Every call, in order, each under ``deadline`` seconds per completion (wall clock, request to reply);
        one :class:`Outcome` per distinct case (a case repeated in a group: its worst score, see :func:`_worst`).
        ``warmups``: per set of columns (:func:`call_columns`), the call each fresh process for calls with those
        columns scores first (:meth:`_ready`); ``training``: the run whose completion ids each call carries (each
        call is one step of the reward process's run, the warm-up's too)."""
        self._run, self._warmups = training, dict(warmups or {})
        calls = list(calls)
        group = training.group_size if training is not None else 1
        outcomes: list[Outcome] = []
        for n, call in enumerate(calls):
            later = calls[n + 1:]
            status, scores, detail, seconds = self._call(call, later)
            if status == "scored":
                found = [(it.case, "scored", score, "") for it, score in zip(call.items, scores)]
                per = seconds / len(call.items)
            else:  # each completion alone (in every group of a step), a step each, for its own status
                found, alone_seconds = [], 0.0
                alone = [Call((it,) * len(call.items)) for it in {it.case.id: it for it in call.items}.values()]
                for k, one in enumerate(alone):
                    s, sc, d, secs = self._call(one, [*alone[k + 1:], *later], group)
                    found += [(one.items[0].case, s, x, d) for x in (sc or [None])]
                    alone_seconds += secs
                per = alone_seconds / max(1, len({f[0].id for f in found}))
                if all(f[1] == "scored" for f in found):
                    batch = Case(id=f"call-{n + 1}", cls="batching", completion="", expected=0,
                                 note=f"a call of {len(call.items)} completions ({', '.join(dict.fromkeys(it.case.id for it in call.items))})")
                    outcomes.append(Outcome(batch, "error" if status != "timeout" else "timeout", None, seconds,
                                            f"the call failed ({status}: {detail}) while each completion alone scored"))
            for outcome in _worst([Outcome(case, s, score, per, d) for case, s, score, d in found]):
                outcomes.append(outcome)
                if on_case is not None:
                    on_case(outcome)
        return outcomes

    def close(self, graceful: bool = True):
        if self._proc is not None:
            self._proc.close(graceful=graceful)
            self._proc = None
        self._tmp.cleanup()
