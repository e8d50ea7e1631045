"""Progress on a terminal is a live bar; redirected to a file it is plain lines, one per update (rate-limited), with
no ``\\r``: trl_rlvr.evaluation.progress, the model conversion's steps, the Trainer's bar under ``trl-rlvr train``."""

import io

from trl_rlvr.evaluation.progress import LineProgress, is_terminal, progress_bar


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_file_gets_one_plain_line_per_update():
    out = io.StringIO()
    bar = progress_bar(3, "sampling n=4", unit="question", file=out, min_interval=0)
    assert isinstance(bar, LineProgress)
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert [line.split(" [")[0] for line in lines] == [f"sampling n=4: {i}/3 question" for i in (1, 2, 3)]


def test_lines_are_rate_limited_and_the_last_is_always_written():
    out, clock = io.StringIO(), FakeClock()
    bar = LineProgress(100, "extracting gguf", unit="B", file=out, min_interval=10.0, clock=clock)
    for _ in range(100):
        clock.now += 0.5
        bar.update(1)
    bar.close()
    counts = [line.split(":")[1].split()[0] for line in out.getvalue().splitlines()]
    assert counts == ["1/100", "21/100", "41/100", "61/100", "81/100", "100/100"]  # every 10 s, and the end


def test_closing_early_says_where_it_stopped_once():
    out = io.StringIO()
    with LineProgress(10, "x", file=out, min_interval=1e9) as bar:
        bar.update(1)
        bar.update(1)
    assert [line.split(" [")[0] for line in out.getvalue().splitlines()] == ["x: 1/10 it", "x: 2/10 it"]


def test_a_terminal_gets_tqdm():
    from tqdm.auto import tqdm

    term = Terminal()
    assert is_terminal(term) and not is_terminal(io.StringIO())
    bar = progress_bar(2, "sampling", file=term)
    assert isinstance(bar, tqdm)
    bar.close()


def test_conversion_steps_are_lines_in_a_log(capsys):
    from trl_rlvr.scripts.models import _steps

    with _steps(2, "Converting model.gguf", quiet=False) as step:
        step("tokenizer")
        step("saving")
    err = capsys.readouterr().err
    assert "\r" not in err
    assert [line.split(" (")[0] for line in err.splitlines()] == [
        "Converting model.gguf: tokenizer", "Converting model.gguf: saving", "Converting model.gguf: done"]


def test_trl_rlvr_train_prints_log_lines_not_a_bar_when_not_on_a_terminal():
    """`trl-rlvr train > run.log`: the Trainer's tqdm bar off (its PrinterCallback prints one line per logging
    step); a recipe's own `disable_tqdm` still wins."""
    from trl_rlvr.scripts.train import log_file_defaults, make_parser

    defaults = log_file_defaults()  # pytest captures stderr: not a terminal
    assert defaults == {"disable_tqdm": True}
    _, args, _ = make_parser(defaults=defaults).parse_args_and_config(["--output_dir", "/tmp/x", "--bf16", "false"])
    assert args.disable_tqdm is True
    _, args, _ = make_parser(defaults=defaults).parse_args_and_config(["--output_dir", "/tmp/x", "--bf16", "false", "--disable_tqdm",
                                                                       "false"])
    assert args.disable_tqdm is False
