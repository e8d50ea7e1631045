"""``PythonEnvironment``: a sandboxed, persistent Python interpreter per rollout, as a TRL environment.

TRL's ``GRPOTrainer(environment_factory=PythonEnvironment)`` constructs instances once, calls ``reset(**row)``
before each rollout, and offers each public method as a tool, its schema read from the docstring. Here there is
one tool, ``python(code)``. Each rollout gets its own interpreter (a fresh fork of a clean, sandboxed zygote,
with a tmpfs of its own: ``sandbox/interpreter.py``); the host side (``host/interpreter_server.py``) holds the
server process and, per environment, the pipes and pidfd of its current interpreter, and never runs a cell itself.
Between calls the interpreter is stopped. ``_dispatch_call`` sends a call's cell ahead of the call, and ``python``
then only collects its reply; ``python`` first sends the whole turn's cells ahead when the trainer has joined the
environment to its batch's tool turns (``_join_tool_turns``: ``trl_rlvr.rollouts.tool_turn``). A cell is charged
from its own send to its own reply, as the host's I/O loop stamps it, whatever the other rollouts' cells do.

Bounds, each a keyword argument of ``PythonEnvironment`` (docs/python_tool.md has the table): a cell's time
(an alarm inside the interpreter, then SIGKILL from outside), the rollout's wall time (its calls together) and
CPU time (RLIMIT_CPU), the interpreter's address space, the characters of a cell and of a reply.
"""

from __future__ import annotations

import dataclasses
import re
import threading

from .host import launcher
from .host.interpreter_server import Interpreter, collect, shared_server
from .sandbox import interpreter

GRACE_S = 1.0  # after a cell's alarm, how long the interpreter may take to answer before it is killed

RESTARTED = "names, imports and files of earlier calls are gone"

#: ``error_reply`` values: a call's reply as it is, or, for a call that raised, the last line of its error (ToRL).
ERROR_REPLIES = ("full", "last_line")

#: A line of a cell's output that shows an error: a traceback's header, or an exception line as Python prints it
#: (``IndexError: list index out of range``, ``mypkg.ParseError``, ``Error: ...``, ``KeyboardInterrupt``).
_ERROR_LINE = re.compile(r"Traceback \(most recent call last\):"
                         r"|(?:(?:[A-Za-z_][\w.]*)?(?:Error|Exception)|SystemExit|KeyboardInterrupt)(?::.*|\(.*\))?")


def shows_error(output: str) -> bool:
    """Whether a cell's output (stdout and stderr together) has a line that shows an error (:data:`_ERROR_LINE`,
    the whole line, stripped): what ``traceback.print_exc()``, ``print(repr(e))``-style or ``logging.exception``
    print when a cell catches an error. A cell that prints a fake traceback counts an error against itself."""
    return any(_ERROR_LINE.fullmatch(line.strip()) for line in output.splitlines())


@dataclasses.dataclass(frozen=True)
class ToolLimits:
    """The bounds of one rollout's interpreter (see docs/python_tool.md)."""

    timeout: float = 10.0  # wall seconds per cell
    rollout_timeout: float = 60.0  # wall seconds of all cells of one rollout together; also its CPU seconds
    memory_mb: int = 1024  # address space of the interpreter; as root also its own memory cgroup (+ its tmpfs, slack)
    max_output_chars: int = 4000  # characters of one reply
    max_code_chars: int = 65536  # characters of one cell

    def __post_init__(self):
        for name in ("timeout", "rollout_timeout", "memory_mb", "max_output_chars", "max_code_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"PythonEnvironment: {name} must be a positive number, not {value!r}")
        if self.max_output_chars < 200:
            raise ValueError(f"PythonEnvironment: max_output_chars must be at least 200, not {self.max_output_chars}")


# ---------------------------------------------------------------- the environment
class PythonEnvironment:
    """A sandboxed Python interpreter per rollout, for ``GRPOTrainer(environment_factory=PythonEnvironment)``.

    ``reset(**row)`` starts a fresh interpreter; ``python(code)`` is the model's tool. Options (all keyword
    arguments with defaults, so TRL can call the class with none; pass others with ``functools.partial``):
    ``timeout`` (s per cell), ``rollout_timeout`` (s of all cells of a rollout), ``memory_mb``,
    ``max_output_chars``, ``max_code_chars``, ``isolation`` ("bwrap", or the much weaker "rlimits"),
    ``error_reply`` ("full", or "last_line": ToRL's error replies, Li et al. 2025, arXiv 2503.23383; a call that
    raised replies with the last line of its error only, :func:`trl_rlvr.algorithms.multi_turn.last_error_line`).
    Whether a call raised is this environment's own count (``stats["errors"]`` went up during the call), never the
    reply's text: a cell can print a fake traceback, and that is output, kept whole. ``RLVRTrainer`` sets
    ``error_reply`` on its environments from ``RLVRConfig.tool_error_reply="last_line"``.

    After each rollout ``stats`` holds its tool metrics: ``calls``, ``errors`` (cells that raised, an exit of any
    status included, and calls refused), ``timeouts``, ``restarts`` (interpreters that died or hung and were
    replaced), ``printed_errors`` (cells that ran to the end but whose output shows an error, :func:`shows_error`:
    a caught error printed, to stdout or stderr). A cell counts in one of ``errors``, ``timeouts`` and
    ``printed_errors`` at most, so their sum is the errors the rollout shows. ``cells`` holds the source of
    the rollout's cells that ran without an error, in order (for a ``get_reward`` that re-runs them through
    ``code_sandbox``'s verdict path; docs/python_tool.md).
    """

    def __init__(self, *, timeout: float = 10.0, rollout_timeout: float = 60.0, memory_mb: int = 1024,
                 max_output_chars: int = 4000, max_code_chars: int = 65536, isolation: str = "bwrap",
                 error_reply: str = "full"):  # fmt: skip
        self.limits = ToolLimits(timeout, rollout_timeout, memory_mb, max_output_chars, max_code_chars)
        if error_reply not in ERROR_REPLIES:
            raise ValueError(f"PythonEnvironment: error_reply must be one of {ERROR_REPLIES}, not {error_reply!r}")
        self.error_reply = error_reply
        if isolation not in ("bwrap", "rlimits"):
            raise ValueError(f"PythonEnvironment: isolation must be 'bwrap' or 'rlimits', not {isolation!r}")
        self.isolation = isolation
        if isolation == "bwrap":  # refuse at construction, with the install hint, rather than at the first batch
            launcher.find_bwrap()
            launcher.sandbox_python()
        self._interpreter: Interpreter | None = None
        self._sent: tuple | None = None  # (code, budget_cut) of the cell in flight
        self._turns = None  # the batch's tool turns while the trainer's tool loop runs (_join_tool_turns)
        self._new_rollout()

    def _new_rollout(self) -> None:
        self.stats = {"calls": 0, "errors": 0, "timeouts": 0, "restarts": 0, "printed_errors": 0}
        self.cells: list[str] = []
        self._spent = 0.0

    def _fresh_interpreter(self) -> None:
        if self._interpreter is not None:
            self._interpreter.close()
        self._interpreter, self._sent = None, None
        lim = self.limits
        cpu_s = max(1, int(lim.rollout_timeout + 0.999))
        self._interpreter = shared_server(self.isolation).spawn(lim.timeout, cpu_s, lim.memory_mb << 20,
                                                                lim.max_output_chars)  # fmt: skip

    def reset(self, **row) -> None:
        """Start the next rollout: a fresh interpreter (nothing of the last one is reachable), zeroed metrics."""
        self._new_rollout()
        self._fresh_interpreter()
        return None

    def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter and return its output.

        Variables, functions, imports and files persist between calls, like cells of a notebook. The reply holds
        what the code printed, the value of a last expression, or the traceback of an error. Only the standard
        library is available; there is no network.

        Args:
            code: The Python source code to run.
        """
        if self._turns is not None:  # the first call of a turn sends every rollout's pending cell ahead
            self._turns.send_pending_calls()
        errors = self.stats["errors"]
        reply = self._run(code)
        if self.error_reply == "last_line" and self.stats["errors"] > errors:
            from trl_rlvr.algorithms.multi_turn import last_error_line

            return last_error_line(reply)
        return reply

    def _run(self, code) -> str:
        """``python(code)``'s reply as the interpreter gave it (or the refusal), with ``stats`` updated."""
        if self._sent is not None and self._sent[0] is not code and self._sent[0] != code:
            self._finish_cell()  # sent ahead for a call that did not come as sent: it ran, so it counts; then this
        if self._sent is None:
            refused = self._refusal(code)
            if refused is not None:  # counted here, once: a call sent ahead was checked without counting
                reply, counter = refused
                self.stats[counter] += 1
                return reply
            self._send(code)
        return self._finish_cell()

    def _join_tool_turns(self, turns) -> None:
        """Keep ``turns`` (a ``trl_rlvr.rollouts.tool_turn.ToolTurns``; None: leave them) for the batch's tool loop:
        each ``python`` call first hands every rollout's pending call to its environment (``_dispatch_call``)."""
        self._turns = turns

    def _dispatch_call(self, name: str, arguments: dict) -> None:
        """Send the cell of a tool call that will come (``python(**arguments)``) now, without waiting for its reply;
        the call itself then collects it. Called for every rollout of a tool turn by the turn's first call, before
        TRL runs the turn's calls one after another (``trl_rlvr.rollouts.tool_turn``): the cells of a turn run
        together. A call that ``python`` would refuse, or a second one while a cell is in flight, is left to the call
        (which counts the refusal: nothing is counted here)."""
        code = arguments.get("code") if name == "python" and isinstance(arguments, dict) else None
        well_formed = isinstance(arguments, dict) and set(arguments) == {"code"}
        if self._sent is None and well_formed and self._refusal(code) is None:
            self._send(code)

    def _refusal(self, code) -> tuple[str, str] | None:
        """Why ``python(code)`` would not run -> (its reply, the ``stats`` counter it goes to), or None. Counts
        nothing: the call that returns the refusal counts it."""
        limits = self.limits
        if not isinstance(code, str):
            return f"error: code must be a string, not {type(code).__name__}", "errors"
        if len(code) > limits.max_code_chars:
            return (f"error: the code has {len(code)} characters; at most {limits.max_code_chars} run in one call",
                    "errors")  # fmt: skip
        if limits.rollout_timeout - self._spent <= 0:
            return f"not run: this rollout's {limits.rollout_timeout:g} s of run time are used up", "timeouts"
        return None

    def _send(self, code: str) -> None:
        """Send the cell of a call that ``_refusal`` let through; it runs while the host goes on."""
        limits = self.limits
        left = limits.rollout_timeout - self._spent
        if self._interpreter is None:
            self._fresh_interpreter()
        self.stats["calls"] += 1
        budget_cut = left < limits.timeout + GRACE_S  # the rollout's budget ends before the cell's own
        self._sent = (code, budget_cut)
        self._interpreter.start(code, min(limits.timeout + GRACE_S, left), 4 * limits.max_output_chars + 64)

    def _finish_cell(self) -> str:
        """The reply to the cell in flight (waiting for it), with the rollout's metrics updated."""
        code, budget_cut = self._sent
        interp = self._interpreter
        reply, done_at = collect(interp)
        self._sent = None
        self._spent += done_at - interp.started
        if reply is None:
            cut = budget_cut and done_at >= interp.deadline
            if cut:  # the whole budget is spent (not a float's rounding short of it)
                self._spent = max(self._spent, self.limits.rollout_timeout)
            return self._restart(interp.started, cut, done_at)
        status, reply = reply[:1], interpreter.clip(reply[1:], self.limits.max_output_chars)
        if status == interpreter.STATUS_TIMEOUT:
            self.stats["timeouts"] += 1
        elif status == interpreter.STATUS_OK:
            self.cells.append(code)
            if shows_error(reply):  # caught and printed: still an error the rollout shows
                self.stats["printed_errors"] += 1
        else:  # an error, or a status the interpreter made up (it is the rollout's own process: its loss)
            self.stats["errors"] += 1
        return reply

    def _restart(self, start: float, budget_cut: bool, end: float) -> str:
        """The interpreter hung past its deadline or died: replace it, and say so."""
        took = end - start
        self.stats["restarts"] += 1
        self._fresh_interpreter()
        self.cells = []
        if budget_cut:
            self.stats["timeouts"] += 1
            return (f"stopped after {took:.1f} s: this rollout's {self.limits.rollout_timeout:g} s of run time are "
                    f"used up; the interpreter was restarted: {RESTARTED}")  # fmt: skip
        if took >= self.limits.timeout:
            self.stats["timeouts"] += 1
            return f"timed out after {self.limits.timeout:g} s; the interpreter was restarted: {RESTARTED}"
        self.stats["errors"] += 1
        return (
            "the interpreter exited or broke its reply channel while running this code (its own exit, a crash, or "
            "its memory or CPU limit); "
            f"a fresh interpreter was started: {RESTARTED}"
        )

    # No public method but the tool: TRL offers every public method of an environment to the model. Closing is
    # ``with PythonEnvironment() as env:`` or garbage collection; the shared server goes at exit.
    def _close(self) -> None:
        if self._interpreter is not None:
            self._interpreter.close()
            self._interpreter, self._sent = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close()

    def __del__(self):
        try:
            self._close()
        except Exception:  # noqa: BLE001
            pass



# ---------------------------------------------------------------- scored by the row's tests
#: Row fields not passed to the reward as columns: TRL passes these to a reward function by their own names.
NOT_COLUMNS = ("prompt", "completion", "completion_ids", "prompts", "completions")
_DEFAULT_REWARD = None
_DEFAULT_REWARD_LOCK = threading.Lock()


class PythonTestsEnvironment(PythonEnvironment):
    """The Python tool for code tasks, with a ``get_reward()`` (TRL adds it as a reward column) that judges the
    rollout by the row's tests through ``code_sandbox``'s trusted verdict path.

    The program judged is the rollout's cells that ran without an error or a timeout, in order
    (``PythonEnvironment.cells``), run afresh in the reward's sandbox. Never the interpreter the model talked to:
    that process is the model's (it can redefine anything, print "all tests passed"), so nothing it says or holds
    is a verdict. A cell that raised is left out as a whole, also what it defined before the error. The reward
    gets the row as TRL gives a reward function a row (every column but ``prompt``, as a one-row batch), so every
    column ``code_sandbox`` reads is there (``tests``, ``test`` + ``entry_point`` + ``prompt_code``, ``io_tests``,
    ...); a row without a test column scores None (TRL ignores it). Rows are checked before training as the
    reward's are (``check_rows``, called by ``RLVRTrainer``). ``reward``: a ``code_sandbox(...)`` reward function
    to use (default: one with default options, shared by the process); every other keyword argument is
    ``PythonEnvironment``'s.
    """

    def __init__(self, *, reward=None, **options):
        super().__init__(**options)
        self._reward = reward
        self._columns: dict = {}
        self._prompt = None

    @classmethod
    def check_rows(cls, dataset, reward=None, **options) -> None:
        """Raise ValueError for a row the reward could not score (``CodeSandboxReward.check_rows``), before
        training. ``reward`` and ``options``: the environment's own (what ``functools.partial`` gave it). A class
        method: TRL offers only an environment's public functions as tools."""
        checker = getattr(reward or _default_reward(), "check_rows", None)
        if callable(checker):
            checker(dataset)

    def reset(self, **row) -> None:
        self._columns = {k: v for k, v in row.items() if k not in NOT_COLUMNS}
        self._prompt = row.get("prompt")
        return super().reset(**row)

    def get_reward(self) -> float | None:
        reward = self._reward or _default_reward()
        program = "\n\n".join(self.cells)
        completion = f"```python\n{program}\n```"
        score = reward(prompts=[self._prompt], completions=[completion], **{k: [v] for k, v in self._columns.items()})
        return score[0]


def _default_reward():
    global _DEFAULT_REWARD
    with _DEFAULT_REWARD_LOCK:
        if _DEFAULT_REWARD is None:
            from .plugin import code_sandbox

            _DEFAULT_REWARD = code_sandbox()
        return _DEFAULT_REWARD
