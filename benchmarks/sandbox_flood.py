"""How long does the host spend on a sample that floods its scratch dir, and on the sample after it?

    python -m benchmarks.sandbox_flood [--timeout 2.0] [--kind mkdir|symlink|open] [--smoke]

One worker; the flooding program creates directories (or symlinks, or empty files) in a loop until
its timeout kills it. Prints the host's wall time for that sample and for the next one on the same
worker slot (a program that passes only in an empty scratch dir), the scores, the error metric and
the worker restarts. Exit status 1 unless the flood scored 0 and the next sample 1 (no leftovers seen);
``--smoke``: a 0.5 s timeout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks._status import finish  # noqa: E402
from reward_plugins.code_sandbox import code_sandbox  # noqa: E402

OPS = {
    "mkdir": "os.mkdir('d%d' % i)",
    "symlink": "os.symlink('x', 'f%d' % i)",
    "open": "os.close(os.open('f%d' % i, os.O_CREAT | os.O_WRONLY))",
}
NEXT = "import os\nleft = os.listdir('.')\ndef add(a, b):\n    return a + b if not left else a - b\n"
TESTS = ["assert add(1, 2) == 3"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--kind", choices=sorted(OPS), default="mkdir")
    ap.add_argument("--smoke", action="store_true", help="seconds: --timeout 0.5")
    args = ap.parse_args(argv)
    if args.smoke:
        args.timeout = 0.5
    f = code_sandbox(num_workers=1, timeout=args.timeout)
    f.pool.start()
    flood = f"import os\ni = 0\nwhile True:\n    {OPS[args.kind]}\n    i += 1\n"
    metrics = {}
    t = time.monotonic()
    r = f(prompts=[""], completions=[flood], tests=[TESTS], log_metric=metrics.__setitem__)
    flood_s = time.monotonic() - t
    t = time.monotonic()
    r2 = f(prompts=[""], completions=[NEXT], tests=[TESTS])
    next_s = time.monotonic() - t
    print(
        f"timeout {args.timeout} s, {args.kind} flood: host {flood_s:.2f} s, score {r}, metrics {metrics}; "
        f"next sample: host {next_s:.2f} s, score {r2}; worker restarts {f.pool.restarts}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    f.close()
    return finish("benchmarks.sandbox_flood", [f"the flood scored {r} (expected [0.0])"] * (r != [0.0])
                  + [f"the next sample scored {r2} (expected [1.0]: its scratch dir must be empty)"] * (r2 != [1.0]))


if __name__ == "__main__":
    sys.exit(main())
