"""Progress display that suits where the output goes: a live tqdm bar on a terminal, plain lines in a log file.

A bar redraws itself with ``\\r``; redirected to a file (``nohup``, CI, ``> run.log``) it leaves hundreds of
overwritten copies on a handful of lines. When the stream is not a terminal, :func:`progress_bar` returns a
:class:`LineProgress` instead: the same ``update``/``close`` interface (and the same text, from tqdm's own
``format_meter``, without the bar), one line per update, at most one every ``min_interval`` seconds, and always the
last. :func:`plain_library_bars` turns off the bars that transformers, datasets and the hub draw themselves (loading
and saving weights, the GGUF conversion) when stderr is not a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import IO


def is_terminal(stream: IO | None = None) -> bool:
    """Whether ``stream`` (default: stderr, where progress goes) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class LineProgress:
    """tqdm's interface, written as plain lines: ``desc: 3/10 question [00:12<00:28, 4.00s/question]``."""

    def __init__(self, total: int | float | None, desc: str = "", unit: str = "it", unit_scale: bool = False,
                 file: IO | None = None, min_interval: float = 10.0, clock=time.monotonic):
        self.total, self.desc, self.unit, self.unit_scale = total, desc, unit, unit_scale
        self.file = sys.stderr if file is None else file
        self.min_interval, self.clock = min_interval, clock
        self.n = 0
        self.start = self.clock()
        self._last_line, self._written_n = None, None  # when the last line was written, and at which count
        self._closed = False

    def text(self) -> str:
        from tqdm import tqdm

        return tqdm.format_meter(self.n, self.total, self.clock() - self.start, prefix=self.desc, unit=self.unit,
                                 unit_scale=self.unit_scale,
                                 bar_format="{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}]")

    def _write(self) -> None:
        self.file.write(self.text() + "\n")
        self.file.flush()
        self._last_line, self._written_n = self.clock(), self.n

    def update(self, n: int | float = 1) -> None:
        """Count ``n`` more; write a line unless one was written less than ``min_interval`` seconds ago (the line
        that reaches ``total`` is always written)."""
        self.n += n
        done = self.total is not None and self.n >= self.total
        if done or self._last_line is None or self.clock() - self._last_line >= self.min_interval:
            self._write()

    def close(self) -> None:
        """Write the state it stopped in, unless the last line already said it."""
        if not self._closed:
            self._closed = True
            if self._last_line is None or self._written_n != self.n:
                self._write()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def progress_bar(total: int | float | None, desc: str, unit: str = "it", unit_scale: bool = False,
                 file: IO | None = None, min_interval: float = 10.0):
    """A tqdm bar on a terminal, else a :class:`LineProgress` (``file``: default stderr)."""
    if is_terminal(file):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=file)
    return LineProgress(total, desc, unit=unit, unit_scale=unit_scale, file=file, min_interval=min_interval)


def plain_library_bars() -> bool:
    """When stderr is not a terminal, turn off the progress bars transformers, datasets and huggingface_hub draw
    (they redraw with ``\\r``); returns whether it did. Call it before loading a model."""
    if is_terminal():
        return False
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover - datasets is a dependency
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover - a transformers dependency
        pass
    return True


#: What :class:`StepProgressCallback` shows of a step's logs by default: (logged key, label, format).
STEP_FIELDS = (("rlvr/accuracy", "acc", "{:.0%}"), ("rewards/think_format/mean", "format", "{:.0%}"),
               ("rlvr/zero_signal_frac", "zero-signal", "{:.0%}"), ("completions/mean_length", "len", "{:.0f}"))


def step_line(logs: dict, fields=STEP_FIELDS) -> str:
    """A training step's metrics as one line: ``reward 0.51 | acc 50% | ...`` (a field the step did not log is
    left out); a step that logged no reward trained nothing (no informative group, or too few rows for one
    update: the trainer logs what it trained) and says so."""
    if "reward" not in logs:
        return "nothing trained, no update (no informative group, or too few rows for one update)"
    parts = [f"reward {logs['reward']:.2f}"]
    parts += [f"{label} {fmt.format(logs[key])}" for key, label, fmt in fields if isinstance(logs.get(key), (int, float))]
    return " | ".join(parts)
