"""The length bias of per-answer loss normalisation, reproduced through RLVRTrainer.

The experiment of the tutorial *GRPO and Reinforcement Learning from Verifiable Rewards* (section "An experiment: the length bias"): a toy where length never affects the reward. Sixteen
questions; an answer is at most 8 tokens from 4 answer tokens plus an end token (the end token counts in the length,
an empty answer is wrong); the reward is 1 when the first token is the question's answer. The policy is a table of
logits per (question, position, previous token), starting at 0. Six learners differ only in the loss:

    GRPO                   loss_normalization="per_answer", scale_rewards="group"
    GRPO, summed           loss_normalization="constant",   scale_rewards="group"
    Dr. GRPO, per answer   loss_normalization="per_answer", scale_rewards="none"
    Dr. GRPO               loss_normalization="constant",   scale_rewards="none"
    RLOO, per answer       loss_normalization="per_answer", scale_rewards="none", advantage_baseline="leave_one_out"
    RLOO                   loss_normalization="constant",   scale_rewards="none", advantage_baseline="leave_one_out"

The RLOO rows (Ahmadian et al. 2024) ask whether the baseline matters for the length bias: it should not, the bias
comes from the per-answer normalisation. The tutorial has no RLOO rows.

Every learner takes one Adam step (lr 0.05) per batch of 16 questions x G answers, so the PPO ratio is 1 and the clip
never binds, with no KL term (beta=0). The policy (trl_rlvr/testing/length_bias_toy.py) is a transformers model, so the
trainer samples from it with its normal `generate` path, scores it with a plain reward function and trains it with its
own loss. A plain-PyTorch reference of the same toy, written from the tutorial's description, runs on the same seeds, and
the tutorial's published numbers are printed beside both.

    python examples/length_bias.py                       # full study: G in {4, 16}, 5 seeds, 400 updates
    python examples/length_bias.py --group-sizes 16 --seeds 1 --updates 150 --workers 1
    python examples/length_bias.py --json out.json --plot out.png --table out.txt

Reported at updates 1, 50, 100 and 400 (the batch sampled before that update's step), means of the seeds: accuracy,
mean length of right answers, mean length of wrong answers (a seed with no wrong answer in that batch is left out of
that mean; "nan" when no seed has one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from trl_rlvr.testing.length_bias_toy import (
    LMAX,
    METHODS,
    Q,
    batch_stats,
    build_policy,
    build_tokenizer,
    question_answers,
    reference_run,
)

#: learner -> (loss_normalization, scale_rewards, advantage_baseline)
LEARNERS = {
    "GRPO": ("per_answer", "group", "group_mean"),
    "GRPO, summed": ("constant", "group", "group_mean"),
    "Dr. GRPO, per answer": ("per_answer", "none", "group_mean"),
    "Dr. GRPO": ("constant", "none", "group_mean"),
    "RLOO, per answer": ("per_answer", "none", "leave_one_out"),
    "RLOO": ("constant", "none", "leave_one_out"),
}
assert tuple(LEARNERS) == METHODS
REPORT_AT = (1, 50, 100, 400)
LR = 0.05

#: The tutorial's published table (5 seeds): {G: {learner: [(acc, len_right, len_wrong) at updates 1, 50, 100, 400]}}.
PUBLISHED_TABLE = {
    4: {
        "GRPO": [(0.22, 5.02, 4.03), (0.78, 4.27, 4.53), (0.96, 3.59, 4.43), (0.99, 2.83, 5.46)],
        "GRPO, summed": [(0.22, 5.02, 4.03), (0.84, 5.03, 4.07), (0.97, 5.03, 3.89), (1.00, 4.98, 5.00)],
        "Dr. GRPO, per answer": [(0.22, 5.02, 4.03), (0.78, 4.28, 4.50), (0.96, 3.58, 4.44), (0.99, 2.83, 5.15)],
        "Dr. GRPO": [(0.22, 5.02, 4.03), (0.84, 5.02, 4.03), (0.97, 5.04, 3.83), (1.00, 5.00, 5.46)],
    },
    16: {
        "GRPO": [(0.20, 4.95, 3.97), (0.91, 3.28, 4.50), (0.99, 2.55, 4.38), (1.00, 2.30, 5.08)],
        "GRPO, summed": [(0.20, 4.95, 3.97), (0.93, 4.92, 4.01), (0.99, 4.86, 4.05), (1.00, 4.84, 3.95)],
        "Dr. GRPO, per answer": [(0.20, 4.95, 3.97), (0.91, 3.26, 4.51), (0.98, 2.62, 4.57), (1.00, 2.35, 4.58)],
        "Dr. GRPO": [(0.20, 4.95, 3.97), (0.92, 4.93, 3.97), (0.98, 4.88, 3.99), (1.00, 4.85, 3.40)],
    },
}


# ---------------------------------------------------------------------------------------------------------------------
# One run through the trainer


def trainer_run(method: str, group_size: int, seed: int, updates: int, lr: float = LR, batches: list | None = None,
                return_model: bool = False):
    """Train the toy policy with RLVRTrainer; return the stats of the batch sampled at each update (before its step).

    ``batches``: a list to append every sampled batch to, as (questions, completion_ids, rewards), for replaying
    them through the reference (see :func:`replay_reference`). ``return_model``: return (history, trained model).
    """
    import torch
    from datasets import Dataset

    from trl_rlvr import RLVRConfig, RLVRTrainer

    normalization, scale_rewards, baseline = LEARNERS[method]
    answers = question_answers(seed)
    history: list[dict] = []

    def first_token_reward(prompts, completions, completion_ids, answer, **kwargs):
        """1 when the first completion token is the question's answer (an empty answer, eos first, is wrong)."""
        rewards = [1.0 if ids and ids[0] == a else 0.0 for ids, a in zip(completion_ids, answer, strict=True)]
        lengths = [len(ids) for ids in completion_ids]  # eos included, as in the trainer's completion_mask
        history.append(batch_stats(torch.tensor(rewards), torch.tensor(lengths)))
        if batches is not None:
            questions = [int(p[1:]) for p in prompts]
            batches.append((questions, [list(ids) for ids in completion_ids], rewards))
        return rewards

    # One row per question and update, in order: with shuffling off, each batch holds the 16 questions once each.
    dataset = Dataset.from_dict(
        {"prompt": [f"q{i}" for i in range(Q)] * updates, "answer": answers * updates}
    )
    with tempfile.TemporaryDirectory(prefix="length_bias_") as out:
        args = RLVRConfig(
            output_dir=out,
            loss_normalization=normalization,
            scale_rewards=scale_rewards,
            advantage_baseline=baseline,
            beta=0.0,
            num_iterations=1,  # one gradient step per batch: ratio 1, the clip never binds
            num_generations=group_size,
            per_device_train_batch_size=Q * group_size,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            max_completion_length=LMAX,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            shuffle_dataset=False,
            max_steps=updates,
            learning_rate=lr,
            optim="adamw_torch",
            adam_beta1=0.9,
            adam_beta2=0.999,
            adam_epsilon=1e-8,
            weight_decay=0.0,  # Adam, as in the reference
            max_grad_norm=0.0,  # no clipping
            lr_scheduler_type="constant",
            warmup_steps=0,
            seed=seed,
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_pin_memory=False,
        )
        trainer = RLVRTrainer(
            model=build_policy(),
            reward_funcs=[first_token_reward],
            args=args,
            train_dataset=dataset,
            processing_class=build_tokenizer(),
        )
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # logging is off; this only prints the end-of-training summary
        trainer.train()
    assert len(history) == updates, (len(history), updates)
    return (history, trainer.model) if return_model else history


def replay_reference(batches, method: str, group_size: int, lr: float = LR):
    """Apply the reference's update (the tutorial's loss, plain Adam) to the batches the trainer sampled, from a zero
    table; return the table, shape (Q, LMAX, V + 2, V + 1). Equal to the trainer's table if the trainer's loss,
    advantages and optimizer are the tutorial's."""
    import torch

    from trl_rlvr.testing.length_bias_toy import END, new_reference_table, reference_loss

    logits, opt = new_reference_table(lr)
    for questions, completion_ids, rewards in batches:
        q = torch.tensor(questions)
        assert (q.view(-1, group_size) == q.view(-1, group_size)[:, :1]).all(), "rows must come group after group"
        toks = torch.full((len(q), LMAX), END, dtype=torch.long)
        for i, ids in enumerate(completion_ids):
            toks[i, : len(ids)] = torch.tensor(ids)  # answer token k has id k, the end token id V == END
        length = torch.tensor([len(ids) for ids in completion_ids])
        loss = reference_loss(logits, toks, length, torch.tensor(rewards), q, method, group_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return logits.detach()


# ---------------------------------------------------------------------------------------------------------------------
# The study


def _cache_path(cache_dir, job) -> Path:
    kind, method, group_size, seed, updates = job
    name = f"{kind}-{method.replace(' ', '').replace(',', '_').replace('.', '')}-G{group_size}-s{seed}-u{updates}.json"
    return Path(cache_dir) / name


def _job(job, cache_dir=None):
    kind, method, group_size, seed, updates = job
    import torch

    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    run = trainer_run if kind == "trainer" else reference_run
    history = run(method, group_size, seed, updates)
    res = {"kind": kind, "method": method, "group_size": group_size, "seed": seed, "updates": updates,
           "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "history": history}
    if cache_dir is not None:  # one file per finished run, so an interrupted study resumes where it stopped
        path = _cache_path(cache_dir, job)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res))
        tmp.replace(path)
    return res


def run_jobs(jobs, workers: int, log=print, cache_dir=None):
    results, todo = [], []
    for job in jobs:
        path = _cache_path(cache_dir, job) if cache_dir else None
        if path is not None and path.exists():
            results.append(json.loads(path.read_text()))
            results[-1]["from_cache"] = True
            log(_progress(results[-1], len(results), len(jobs)) + " [from cache]")
        else:
            todo.append(job)
    if cache_dir:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    if workers <= 1:
        for job in todo:
            results.append(_job(job, cache_dir))
            log(_progress(results[-1], len(results), len(jobs)))
        return results
    import functools
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(workers) as pool:
        for res in pool.imap_unordered(functools.partial(_job, cache_dir=cache_dir), todo):
            results.append(res)
            log(_progress(res, len(results), len(jobs)))
    return results


def _progress(res, done, total):
    return (f"[{done}/{total}] {res['kind']:9s} {res['method']:22s} G={res['group_size']:<2d} seed={res['seed']} "
            f"{res['updates']} updates in {res['seconds']:.1f} s (cpu {res['cpu_seconds']:.1f} s)")


def _nanmean(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(results, report_at):
    """-> {(kind, G, method): {"at": {update: (acc, right, wrong)}, "curve": [(acc, right, wrong) per update]}}."""
    groups: dict = {}
    for res in results:
        groups.setdefault((res["kind"], res["group_size"], res["method"]), []).append(res["history"])
    summary = {}
    for key, histories in groups.items():
        n = min(len(h) for h in histories)
        curve = [
            tuple(_nanmean([h[u][f] for h in histories]) for f in ("accuracy", "len_right", "len_wrong"))
            for u in range(n)
        ]
        summary[key] = {"seeds": len(histories), "curve": curve,
                        "at": {u: curve[u - 1] for u in report_at if u <= n}}
    return summary


def _cell(t):
    return " ".join(f"{x:6.2f}" for x in t)


def format_table(summary, group_sizes, report_at):
    """The tutorial's layout, with three rows per learner: RLVRTrainer, the reference, the tutorial's published numbers."""
    lines = []
    width = 22
    for G in group_sizes:
        lines.append(f"group size {G}: accuracy / mean length of right answers / of wrong answers, "
                     "mean of N seeds (xN), at update")
        lines.append(" " * (width + 16) + "".join(f"{u:>22d}" for u in report_at))
        for method in METHODS:
            if not any((kind, G, method) in summary for kind in ("trainer", "reference")):
                continue
            name = method
            for kind in ("trainer", "reference", "seed"):
                if kind == "seed":
                    at = dict(zip(REPORT_AT, PUBLISHED_TABLE.get(G, {}).get(method, [])))
                    if not at:
                        continue
                    label = "published x5"
                else:
                    entry = summary.get((kind, G, method))
                    if entry is None:
                        continue
                    at = entry["at"]
                    label = f"{'RLVRTrainer' if kind == 'trainer' else 'reference'} x{entry['seeds']}"
                cells = "".join("  " + (_cell(at[u]) if u in at else " " * 20) for u in report_at)
                lines.append(f"{name:{width}s} {label:15s}{cells}")
                name = ""
    return "\n".join(lines)


def _smooth(ys, window: int = 10):
    """Trailing mean over the last `window` updates, ignoring NaN (batches with no wrong answer)."""
    return [_nanmean(ys[max(0, i - window + 1): i + 1]) for i in range(len(ys))]


def plot(summary, group_sizes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(group_sizes), len(METHODS), figsize=(4 * len(METHODS), 3.2 * len(group_sizes)),
                             sharex=True, sharey=True, squeeze=False)
    for r, G in enumerate(group_sizes):
        for c, method in enumerate(METHODS):
            ax = axes[r][c]
            for kind, style in (("trainer", "-"), ("reference", ":")):
                entry = summary.get((kind, G, method))
                if entry is None:
                    continue
                xs = range(1, len(entry["curve"]) + 1)
                label = "RLVRTrainer" if kind == "trainer" else "reference"
                ax.plot(xs, _smooth([p[1] for p in entry["curve"]]), style, color="tab:green", label=f"right, {label}")
                ax.plot(xs, _smooth([p[2] for p in entry["curve"]]), style, color="tab:red", label=f"wrong, {label}",
                        alpha=0.8)
            ax.set_title(f"{method}, G={G}", fontsize=10)
            ax.set_ylim(0.8, LMAX + 0.2)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("mean answer length (tokens)")
            if r == len(group_sizes) - 1:
                ax.set_xlabel("update")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Mean length of right (green) and wrong (red) answers; the reward never depends on length "
                 "(mean of seeds, trailing mean of 10 updates)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--group-sizes", type=int, nargs="+", default=[4, 16])
    p.add_argument("--seeds", type=int, default=5, help="number of seeds (0, 1, ..., N-1)")
    p.add_argument("--updates", type=int, default=400)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--no-reference", action="store_true", help="skip the plain-PyTorch reference")
    p.add_argument("--reference-seeds", type=int, help="seeds for the (fast) reference; default: --seeds")
    p.add_argument("--workers", type=int, default=2, help="parallel processes (each imports TRL once)")
    p.add_argument("--cache", help="directory keeping each finished run, to resume an interrupted study")
    p.add_argument("--json", help="write every row (and the per-update curves) here")
    p.add_argument("--table", help="write the table here too")
    p.add_argument("--plot", help="PNG of right/wrong lengths over updates per learner")
    a = p.parse_args(argv)

    kinds = ["trainer"] + ([] if a.no_reference else ["reference"])
    # Seed after seed (so an interrupted study, rerun with --cache and fewer --seeds, has whole seeds), the longest
    # runs (trainer, G=16) first within a seed.
    ref_seeds = a.seeds if a.reference_seeds is None else a.reference_seeds
    jobs = [(k, m, G, s, a.updates) for s in range(max(a.seeds, ref_seeds)) for k in kinds
            for G in sorted(a.group_sizes, reverse=True) for m in a.methods
            if s < (a.seeds if k == "trainer" else ref_seeds)]
    t0 = time.perf_counter()
    results = run_jobs(jobs, a.workers, log=lambda s: print(s, flush=True), cache_dir=a.cache)
    wall = time.perf_counter() - t0
    report_at = tuple(u for u in REPORT_AT if u <= a.updates) or (a.updates,)
    summary = summarize(results, report_at)
    table = format_table(summary, a.group_sizes, report_at)
    print(table)
    timing = (f"wall time {wall:.0f} s with {a.workers} worker(s); time inside the runs "
              f"{sum(r['seconds'] for r in results):.0f} s (their own cpu time "
              f"{sum(r['cpu_seconds'] for r in results):.0f} s)")
    cached = sum(bool(r.get("from_cache")) for r in results)
    if cached:
        timing += f"; {cached} of {len(results)} runs were loaded from --cache (their times are from when they ran)"
    print(timing)
    if a.table:
        Path(a.table).write_text(table + "\n" + timing + "\n")
    if a.json:
        rows = []
        for (kind, G, method), entry in sorted(summary.items()):
            for u, (acc, right, wrong) in entry["at"].items():
                published_row = dict(zip(REPORT_AT, PUBLISHED_TABLE.get(G, {}).get(method, []))).get(u)
                rows.append({"source": kind, "group_size": G, "method": method, "update": u, "seeds": entry["seeds"],
                             "accuracy": acc, "len_right": right, "len_wrong": wrong,
                             "published": dict(zip(("accuracy", "len_right", "len_wrong"), published_row))
                             if published_row else None})
        payload = {
            "settings": {"group_sizes": a.group_sizes, "seeds": a.seeds, "reference_seeds": ref_seeds, "updates": a.updates, "lr": LR,
                         "learners": {m: dict(zip(("loss_normalization", "scale_rewards", "advantage_baseline"), LEARNERS[m]))
                                      for m in a.methods}, "workers": a.workers, "wall_seconds": wall},
            "rows": rows,
            # every run at the reported updates, and the mean curves over seeds (one point per update, for the plot)
            "runs": [{**{k: v for k, v in r.items() if k != "history"},
                      "at": {u: {k: round(v, 4) for k, v in r["history"][u - 1].items()} for u in report_at}}
                     for r in results],
            "curves": {f"{kind} | G={G} | {method}": [[round(x, 3) for x in p] for p in entry["curve"]]
                       for (kind, G, method), entry in sorted(summary.items())},
        }
        Path(a.json).write_text(json.dumps(payload, separators=(",", ":"), allow_nan=True))
    if a.plot:
        plot(summary, a.group_sizes, a.plot)
    return summary


if __name__ == "__main__":
    main()
