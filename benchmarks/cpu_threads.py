"""Torch threads and OpenMP's waiting policy on shared cores: how much slower does a CPU job get when another process
takes a core?

    python -m benchmarks.cpu_threads [--rounds 3] [--reps 200] [--busy 1] [--save FILE] [--smoke]
    python -m benchmarks.cpu_threads --tool-eval OUTPUT_DIR/cold_start [--rounds 3] [--save FILE]

Each case runs in a fresh process (OpenMP reads its environment when torch loads): torch threads 1 or 2 (one per
core here), a waiting policy (:data:`POLICIES`: OpenMP's default, ``OMP_WAIT_POLICY=PASSIVE``, or the product's
short spin then sleep, ``trl_rlvr.scripts.train.passive_openmp_waits``), and either nothing else or ``--busy``
pure-Python spinning processes competing for the cores. The work has the shapes of SmolLM2-135M (hidden 576, MLP
1536, vocabulary 49152):

* ``decode``: one generation step of 16 rows through an MLP block and the LM head (many small parallel regions,
  where spinning threads hurt most: the ``generate`` of both main jobs);
* ``train``: a forward and backward of the MLP block over 2 x 192 tokens (a micro-batch of a training step);
* with ``--tool-eval MODEL_DIR`` instead, 2 threads only: one batch of the tool job's held-out evaluation (its first
  16 questions x 4 tool rollouts, the job's settings, the sandboxed tool) on the model saved in ``MODEL_DIR`` (the
  job's ``OUTPUT_DIR/cold_start``): the real ``generate`` with its many small regions, seconds per batch.

Per case: the median wall time of one op over ``--reps`` ops, in each of ``--rounds`` rounds; rounds alternate the
cases so that drift of a shared machine hits them alike; the table gives the median over rounds, and the slowdown
of each setting with the busy process against the same setting without it. The command, the load average and the
table are printed; ``--save`` writes them as JSON. Quoted in docs/benchmarks.md. ``--smoke``: 1 thread with the
default policy and 2 threads with PASSIVE, quiet and busy, 1 round of 5 ops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks._status import finish
from trl_rlvr.scripts.train import SHORT_SPIN_COUNT  # imports no torch

HIDDEN, MLP, VOCAB = 576, 1536, 49152
#: waiting policies -> the environment that sets them
POLICIES = {"default": {}, "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
            "short spin": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SHORT_SPIN_COUNT}}
CASES = [(threads, policy) for threads in (1, 2) for policy in POLICIES]


def child(threads: int, reps: int) -> dict:
    """Run in the case's own process: median seconds per op of each workload."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    up, down, head = torch.nn.Linear(HIDDEN, MLP), torch.nn.Linear(MLP, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB)
    x_decode = torch.randn(16, HIDDEN)
    x_train = torch.randn(2 * 192, HIDDEN, requires_grad=True)

    def decode():
        with torch.no_grad():
            h = x_decode
            for _ in range(4):  # a few layers' worth of small regions
                h = h + down(torch.nn.functional.silu(up(h)))
            head(h)

    def train():
        out = down(torch.nn.functional.silu(up(x_train)))
        out.sum().backward()

    result = {}
    for name, op in (("decode", decode), ("train", train)):
        for _ in range(3):
            op()  # warm-up
        times = []
        for _ in range(reps if name == "decode" else max(1, reps // 5)):
            t = time.perf_counter()
            op()
            times.append(time.perf_counter() - t)
        result[name] = statistics.median(times)
    return result


def tool_eval_child(model_dir: str, questions: int = 16) -> dict:
    """Run in the case's own process: seconds for one batch of the tool job's held-out evaluation."""
    import torch  # first: OpenMP reads the case's environment now (the job's module would set its own default)
    from transformers import AutoModelForCausalLM

    from benchmarks.tool_rl_throughput import heldout_tool_rollouts, tool_job
    from trl_rlvr.scripts.models import resolve_model_path

    torch.set_num_threads(2)
    example = tool_job()
    script_args, training_args, model_args = example.parse_args(["--output_dir", "unused"])
    tokenizer = example.tool_tokenizer(resolve_model_path(model_args.model_name_or_path, quiet=True),
                                       script_args.chat_template)
    rows = example.tool_rows(example.question_rows(script_args)[1], script_args.system_prompt)[:questions]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    start = time.perf_counter()
    groups = heldout_tool_rollouts(example, model, tokenizer, script_args, training_args, rows)
    return {"tool_eval": time.perf_counter() - start, "tokens": sum(len(s[1]) for g in groups for s in g)}


def spin():  # a busy process: one core's worth of pure Python
    while True:
        pass


def run_case(threads: int, policy: str, reps: int, busy: int, tool_eval: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "KMP_BLOCKTIME")}
    env.update(POLICIES[policy])
    spinners = [subprocess.Popen([sys.executable, "-c", "from benchmarks.cpu_threads import spin; spin()"], env=env)
                for _ in range(busy)]
    work = ["--tool-eval", tool_eval] if tool_eval else ["--reps", str(reps)]
    try:
        out = subprocess.run([sys.executable, "-m", "benchmarks.cpu_threads", "--child", str(threads), *work],
                             env=env, capture_output=True, text=True, check=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=200, help="decode ops per case and round (train: a fifth)")
    parser.add_argument("--busy", type=int, default=1, help="spinning processes in the 'busy' cases")
    parser.add_argument("--save", default=None, help="write the results as JSON to this file")
    parser.add_argument("--tool-eval", default=None, metavar="MODEL_DIR",
                        help="time one batch of the tool job's evaluation on this model (2 threads) instead")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(tool_eval_child(args.tool_eval) if args.tool_eval else child(args.child, args.reps)))
        return 0
    cases = CASES
    works = ("tool_eval",) if args.tool_eval else ("decode", "train")
    if args.tool_eval:
        cases = [(2, policy) for policy in POLICIES]
    if args.smoke:  # two settings, quiet and busy: four short processes
        args.rounds, args.reps, cases = 1, 5, [(1, "default"), (2, "short spin")]
    command = "python -m benchmarks.cpu_threads " + " ".join(sys.argv[1:] if argv is None else argv)
    load_start = os.getloadavg()
    samples: dict[tuple, list[dict]] = {}
    failures = []
    for _ in range(args.rounds):
        for busy in (0, args.busy):
            for threads, policy in cases:
                try:
                    samples.setdefault((threads, policy, busy), []).append(
                        run_case(threads, policy, args.reps, busy, args.tool_eval))
                except subprocess.CalledProcessError as e:
                    failures.append(f"threads={threads} policy={policy} busy={busy}: {e.stderr[-500:]}")
    rows = []
    for (threads, policy, busy), runs in sorted(samples.items()):
        row = {"threads": threads, "wait_policy": policy, "busy_processes": busy}
        for work in works:
            row[f"{work}_ms"] = 1000 * statistics.median(r[work] for r in runs)
        rows.append(row)
    by_key = {(r["threads"], r["wait_policy"], r["busy_processes"]): r for r in rows}
    print(f"$ {command}")
    print(f"load average at the start {load_start[0]:.2f}, at the end {os.getloadavg()[0]:.2f}; "
          f"{len(os.sched_getaffinity(0))} cores; medians over {args.rounds} round(s)")
    print(f"{'threads':>7} {'wait policy':>11} {'busy':>4}" + "".join(f" {w + ' ms':>12} {'x quiet':>8}" for w in works))
    for r in rows:
        quiet = by_key.get((r["threads"], r["wait_policy"], 0))
        ratio = {w: r[f"{w}_ms"] / quiet[f"{w}_ms"] for w in works} if quiet else {}
        r.update({f"{w}_slowdown": ratio[w] for w in ratio})
        print(f"{r['threads']:>7} {r['wait_policy']:>11} {r['busy_processes']:>4}"
              + "".join(f" {r[w + '_ms']:>12.2f} {ratio.get(w, float('nan')):>8.2f}" for w in works))
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"command": command, "load_start": load_start, "load_end": os.getloadavg(), "rows": rows}, f,
                      indent=1)
    if len(rows) != 2 * len(cases) and not failures:
        failures.append(f"{len(rows)} cases measured, expected {2 * len(cases)}")
    return finish("cpu_threads", failures)


if __name__ == "__main__":
    sys.exit(main())
