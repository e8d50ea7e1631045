"""bf16 against fp32 on this CPU: the forward and backward of one linear layer of SmolLM2-135M's MLP size.

    python benchmarks/cpu_bf16.py [--tokens 512] [--repeat 20]

examples/r1zero.py turns bf16 off when there is no GPU; this measures why (ms per forward + backward,
median of ``--repeat``, after a warm-up), on the cores torch uses here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def step_ms(dtype: torch.dtype, tokens: int, repeat: int, autocast: bool = False) -> float:
    """``autocast``: fp32 weights under torch.autocast(bf16), as a Trainer with bf16=True runs on a CPU."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(576, 1536, dtype=dtype)  # SmolLM2-135M: hidden 576, MLP 1536
    x = torch.randn(tokens, 576, dtype=dtype, requires_grad=True)
    times = []
    for i in range(repeat + 3):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = layer(x)
        y.float().sum().backward()
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    fp32 = step_ms(torch.float32, args.tokens, args.repeat)
    bf16 = step_ms(torch.bfloat16, args.tokens, args.repeat)
    mixed = step_ms(torch.float32, args.tokens, args.repeat, autocast=True)
    print(f"ms per forward+backward of {args.tokens} tokens: fp32 {fp32:.2f}, bf16 weights {bf16:.2f} "
          f"({bf16 / fp32:.2f}x fp32), fp32 weights under bf16 autocast {mixed:.2f} ({mixed / fp32:.2f}x fp32)")


if __name__ == "__main__":
    main()
