"""How long ``trl-rlvr COMMAND --help`` takes, each command in a fresh process (what a user waits for):

    python -m benchmarks.cli_help [--repeats 5] [--smoke]

Per command: the median and the slowest wall time of ``python -m trl_rlvr.scripts.cli COMMAND --help`` over
``--repeats`` fresh processes, the help's length in lines, and whether the process imported torch, TRL or
transformers (it must not: tests/scripts/test_cli_help.py checks that without a clock). The goal is under 1 s each;
a slower command is a failure (exit 1). ``trl-rlvr train --help-all`` (TRL's full parser, which imports TRL) is
timed alongside for comparison, without a goal. The command line and the load average are printed with the table.
``--smoke``: one repeat, and only the imports fail it (CI's shared cores make one timing meaningless).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._status import finish

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [[], ["train"], ["doctor"], ["eval"], ["rewards"], ["rewards", "list"], ["rewards", "show"],
            ["rewards", "audit"]]
GOAL_S = 1.0
#: Runs the CLI as the console script does, then says which heavy modules it loaded (on stderr's last line).
_PROBE = ("import sys\nfrom trl_rlvr.scripts.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
          "print('HEAVY', ','.join(m for m in ('torch', 'trl', 'transformers') if m in sys.modules), file=sys.stderr)")


def time_help(args: list[str], repeats: int) -> dict:
    """Wall seconds of ``repeats`` fresh processes printing ``args``'s help; lines; heavy modules imported."""
    seconds, lines, heavy = [], 0, ""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, cwd=ROOT, env=env)
        seconds.append(time.perf_counter() - start)
        lines = proc.stdout.count("\n")
        heavy = proc.stderr.strip().splitlines()[-1].removeprefix("HEAVY").strip() if proc.stderr.strip() else "?"
    return {"median_s": statistics.median(seconds), "max_s": max(seconds), "lines": lines, "heavy": heavy}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one repeat per command")
    args = parser.parse_args(argv)
    repeats = 1 if args.smoke else args.repeats
    print(f"$ python -m benchmarks.cli_help --repeats {repeats}   (load average {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} CPUs)")
    print(f"{'command':<32} {'median':>8} {'slowest':>8} {'lines':>6}  imports torch/trl/transformers")
    failures = []
    for command in [*COMMANDS, ["train", "--help-all"]]:
        full = command if command[-1:] == ["--help-all"] else [*command, "--help"]
        r = time_help(full, repeats if command[-1:] != ["--help-all"] else 1)
        name = "trl-rlvr " + " ".join(full)
        print(f"{name:<32} {r['median_s']:>7.2f}s {r['max_s']:>7.2f}s {r['lines']:>6}  {r['heavy'] or 'none'}")
        if full[-1] == "--help" and r["max_s"] >= GOAL_S and not args.smoke:  # a smoke run on a loaded CI box
            failures.append(f"{name} took {r['max_s']:.2f} s (goal: under {GOAL_S:.0f} s)")
        if full[-1] == "--help" and r["heavy"]:
            failures.append(f"{name} imported {r['heavy']}")
    return finish("cli_help", failures)


if __name__ == "__main__":
    sys.exit(main())
