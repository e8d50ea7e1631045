"""DAPO dynamic sampling on the length-bias toy: informative groups, answers generated, and time to 95% accuracy.

    python -m benchmarks.dynamic_sampling [--seeds 3] [--max-updates 150] [--group-size 4] [--json PATH]
        [--replay-trl DIR] [--smoke]

Exit status 1 when a learner fails or crashes (named on stderr); --smoke runs every learner for 2 updates, one seed.

The task is the length-bias toy of the tutorial *GRPO and Reinforcement Learning from Verifiable Rewards* (trl_rlvr/testing/length_bias_toy.py, imported, not copied): 16 questions, binary
reward (1 when the first answer token is the question's answer), a table of logits starting at 0 (accuracy 1/5), one
Adam step (lr 0.05) per generation batch of 16 prompts x G answers, GRPO loss (per-answer normalisation, group-std
advantages), beta 0, temperature 1. Three learners, same seeds:

    (a) RLVRTrainer, dynamic_sampling=True (max_sampling_rounds=3 by default)
    (b) RLVRTrainer, dynamic_sampling=False
    (c) TRL's experimental GRPOWithReplayBufferTrainer (groups without reward variance replaced from a replay buffer)
    (d) selective_sampling (prompts whose last --selective-window groups had no signal skipped, revisited with
        probability --revisit-probability), (e) selective + dynamic sampling, (f) dynamic sampling with
        dynamic_sampling_oversample=1 (refills generate for the missing groups only), (g) (e) + (f),
        (h) dynamic sampling filtering on the success reward only (meaningful with --shaping > 0; not run by default)

The dataset holds one row per question (a prompt's selective-sampling history is kept per row); --mastered N makes
questions 0..N-1 start mastered (mixed difficulty, as in real data; the 16 questions are otherwise equally hard).
Results: benchmarks/results/dynamic_sampling*.txt (commands at their top), discussed in docs/dynamic_sampling.md.

(c) is not in the installed TRL 1.16: `trl.experimental.grpo_with_replay_buffer` was removed in TRL 1.14
(huggingface/trl PR #7132); the last release that ships it is 1.13.0. To run it, unpack that wheel somewhere and pass
the folder that contains its `trl/` package (its trainer then runs on the installed transformers/accelerate):

    pip download trl==1.13.0 --no-deps -d /tmp/trl113 && (cd /tmp/trl113 && unzip -q trl-1.13.0-py3-none-any.whl 'trl/*')
    python -m benchmarks.dynamic_sampling --replay-trl /tmp/trl113

Without it, (c) is reported as not run, with the import error.

Measured per update (one optimizer step = one generation batch):

* informative share: the share of the rows that reach the loss (``_compute_loss``) with a non-zero advantage; with a
  binary reward a row's advantage is 0 exactly when its group's G rewards are all equal, so this is the share of
  informative groups in the trained batch;
* predicted share without filtering: mean over the 16 questions of 1 - p^G - (1-p)^G, p the policy's exact
  probability of a right first token before the update;
* generated answers (all rounds), and the share of generated groups that were informative (before any filtering);
* accuracy: NOT the batch accuracy but an exact evaluation of the policy after the update, separate from training:
  the mean over the 16 questions of the probability that a sampled answer (temperature 1) is right, read from the
  table (the noise-free limit of a sampled evaluation); the greedy accuracy is recorded too. "Updates to 95%" is the
  first update after which that accuracy is >= 0.95 (--target); wall-clock seconds are from the start of training
  to the end of that update (model building and TRL's import excluded). A run stops there unless --keep-going.

Each learner runs its seeds in one subprocess (TRL imported once); --workers of them run at a time. The machine may
be shared: wall-clock figures are medians and indicative only; the update counts are not affected.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parent.parent

from benchmarks._status import finish  # noqa: E402

METHODS = {
    "a": "RLVRTrainer dynamic_sampling=True",
    "b": "RLVRTrainer dynamic_sampling=False",
    "c": "GRPOWithReplayBufferTrainer",
    "d": "selective_sampling",
    "e": "selective + dynamic",
    "f": "dynamic, oversample=1",
    "g": "selective + dynamic, oversample=1",
    "h": "dynamic, metric=success",
}

#: RLVRConfig switches of each RLVRTrainer learner (besides the shared settings).
SWITCHES = {
    "a": dict(dynamic_sampling=True),
    "b": dict(dynamic_sampling=False),
    "d": dict(selective_sampling=True),
    "e": dict(dynamic_sampling=True, selective_sampling=True),
    "f": dict(dynamic_sampling=True, dynamic_sampling_oversample=1.0),
    "g": dict(dynamic_sampling=True, selective_sampling=True, dynamic_sampling_oversample=1.0),
    "h": dict(dynamic_sampling=True, dynamic_sampling_metric="success"),
}



class Unavailable(Exception):
    """A learner whose trainer the installed TRL does not ship ((c) on TRL >= 1.14): reported as not run."""


# ---------------------------------------------------------------------------------------------------------------------
# One run (inside a worker subprocess)


def run_one(method: str, seed: int, a, records: list) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from trl_rlvr.testing.length_bias_toy import LMAX, START, Q, build_tokenizer, question_answers

    G = a.group_size
    answers = question_answers(seed)
    answer_t = torch.tensor(answers)
    counters = {"answers": 0, "groups": 0, "mixed_groups": 0, "rows": 0, "informative_rows": 0}

    def first_token_reward(prompts, completions, completion_ids, answer, **kwargs):
        rewards = [1.0 if ids and ids[0] == ans else 0.0 for ids, ans in zip(completion_ids, answer, strict=True)]
        groups = torch.tensor(rewards).view(-1, G)
        counters["answers"] += len(rewards)
        counters["groups"] += len(groups)
        counters["mixed_groups"] += int((groups.max(1).values > groups.min(1).values).sum())
        return rewards

    reward_funcs = [first_token_reward]
    if a.shaping:
        def length_shaping(completion_ids, **kwargs):
            """A shaping term that varies inside a group where the success reward does not (verl's score vs acc)."""
            return [-a.shaping * len(ids) / LMAX for ids in completion_ids]

        reward_funcs.append(length_shaping)
    if method in SWITCHES:
        from trl_rlvr import RLVRConfig as Config
        from trl_rlvr import RLVRTrainer as Trainer

        # refills of only the missing groups (oversample) are small: they get twice the rounds
        rounds = a.max_sampling_rounds * (2 if "dynamic_sampling_oversample" in SWITCHES[method] else 1)
        extra = dict(loss_normalization="per_answer", scale_rewards="group", max_sampling_rounds=rounds,
                     revisit_probability=a.revisit_probability, selective_sampling_window=a.selective_window,
                     success_reward="first_token_reward", **SWITCHES[method])
    else:
        try:
            from trl.experimental.grpo_with_replay_buffer import (
                GRPOWithReplayBufferConfig as Config,
            )
            from trl.experimental.grpo_with_replay_buffer import (
                GRPOWithReplayBufferTrainer as Trainer,
            )
        except ImportError as err:  # only this import: any other ImportError is a broken benchmark
            raise Unavailable(str(err)) from err

        extra = dict(loss_type="grpo", scale_rewards="group", replay_buffer_size=a.replay_buffer_size)

    class Probe(Trainer):
        """Counts the rows that reach the loss and those with a non-zero advantage."""

        def _compute_loss(self, model, inputs):
            active = inputs["completion_mask"].sum(dim=1) > 0  # an all-masked row carries nothing
            counters["rows"] += int(active.sum())
            counters["informative_rows"] += int((active & (inputs["advantages"] != 0)).sum())
            return super()._compute_loss(model, inputs)

    state = {"t0": None, "predicted": None, "reached": None}

    def exact_accuracy(model):
        with torch.no_grad():
            logits = model.table()[:, 0, START]  # first-token logits per question: (Q, V + 1)
            p = logits.float().softmax(-1)[torch.arange(Q), answer_t]
            greedy = (logits.argmax(-1) == answer_t).float().mean().item()
        return p, greedy

    class Meter(TrainerCallback):
        def on_train_begin(self, args, st, control, **kw):
            state["t0"] = time.perf_counter()

        def on_step_begin(self, args, st, control, **kw):
            p, _ = exact_accuracy(trainer.model)
            state["predicted"] = (1 - p**G - (1 - p) ** G).mean().item()

        def on_step_end(self, args, st, control, **kw):
            p, greedy = exact_accuracy(trainer.model)
            seconds = time.perf_counter() - state["t0"]
            acc = p.mean().item()
            rec = {"update": st.global_step, "seconds": round(seconds, 3), "accuracy": round(acc, 5),
                   "greedy_accuracy": greedy, "predicted_share": round(state["predicted"], 5), **counters}
            records.append(rec)
            for k in counters:
                counters[k] = 0
            if acc >= a.target and state["reached"] is None:
                state["reached"] = (st.global_step, seconds)
                if not a.keep_going:
                    control.should_training_stop = True

    # One row per question: a prompt's history (selective sampling) is kept per dataset row, and every pass over
    # the 16 rows is one generation batch, as the repeated dataset of earlier versions of this benchmark gave.
    dataset = Dataset.from_dict({"prompt": [f"q{i}" for i in range(Q)], "answer": answers})
    with tempfile.TemporaryDirectory(prefix="dynamic_sampling_") as out:
        args = Config(
            output_dir=out, beta=0.0, num_iterations=1, num_generations=G, per_device_train_batch_size=Q * G,
            gradient_accumulation_steps=1, steps_per_generation=1, max_completion_length=LMAX, temperature=1.0,
            top_p=1.0, top_k=0, shuffle_dataset=False, max_steps=a.max_updates, learning_rate=a.lr,
            optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
            max_grad_norm=0.0, lr_scheduler_type="constant", warmup_steps=0, seed=seed, use_cpu=True, bf16=False,
            activation_checkpointing=False, report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_pin_memory=False, **extra,
        )
        trainer = Probe(model=build_policy_for(answers, a), reward_funcs=reward_funcs, args=args,
                        train_dataset=dataset,
                        processing_class=build_tokenizer())
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(Meter())
        trainer.train()
    return run_summary(method, seed, records, state["reached"])


def build_policy_for(answers: list[int], a):
    """The toy's policy; with --mastered N, questions 0..N-1 start mastered: their right first token gets the logit
    --mastered-logit (p = e^L / (e^L + V), 0.993 at L = 6), the others stay at 0 (p = 1/5). Real datasets mix prompts
    the model already solves with prompts it does not; the toy's 16 questions are otherwise equally hard, so a
    prompt's own history tells no more than the batch's."""
    import torch

    from trl_rlvr.testing.length_bias_toy import LMAX, START, V, build_policy

    model = build_policy()
    with torch.no_grad():
        for q in range(a.mastered):
            model.backbone.table.weight[(q * LMAX) * (V + 2) + START, answers[q]] = a.mastered_logit
    return model


def run_summary(method: str, seed: int, records: list, reached) -> dict:
    n = len(records)
    rows = sum(r["rows"] for r in records)
    groups = sum(r["groups"] for r in records)
    return {
        "method": method, "seed": seed, "updates_run": n,
        "updates_to_target": reached[0] if reached else None,
        "seconds_to_target": round(reached[1], 3) if reached else None,
        "seconds_per_update": records[-1]["seconds"] / n if n else None,
        "informative_share": sum(r["informative_rows"] for r in records) / rows if rows else float("nan"),
        "informative_share_min": min((r["informative_rows"] / r["rows"] for r in records if r["rows"]), default=None),
        "generated_informative_share": sum(r["mixed_groups"] for r in records) / groups if groups else float("nan"),
        "predicted_share": sum(r["predicted_share"] for r in records) / n if n else float("nan"),
        "answers_per_update": sum(r["answers"] for r in records) / n if n else float("nan"),
        "rows_per_update": rows / n if n else float("nan"),
        "final_accuracy": records[-1]["accuracy"] if n else None,
        "history": records,
    }


def worker(method: str, a, out_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    runs, error, skipped = [], None, False
    for seed in range(a.seeds):
        records: list[dict] = []
        try:
            runs.append(run_one(method, seed, a, records))
            r = runs[-1]
            print(f"[{method}] seed {seed}: {r['updates_run']} updates, {a.target:.0%} at {r['updates_to_target']} "
                  f"({r['seconds_to_target']} s)", flush=True)
        except Unavailable as err:  # (c) with a TRL that has no grpo_with_replay_buffer: not run, said so
            import trl

            error = f"{err} (trl {trl.__version__} imported from {os.path.dirname(trl.__file__)})"
            skipped = True
            break
        except Exception as err:  # report, not crash: the other seeds and learners still count
            import traceback

            error = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
            reached = next(((r["update"], r["seconds"]) for r in records if r["accuracy"] >= a.target), None)
            runs.append({**run_summary(method, seed, records, reached), "crashed_in_update": len(records) + 1,
                         "error": f"{type(err).__name__}: {err}"})
            print(f"[{method}] seed {seed}: crashed in update {len(records) + 1}: {type(err).__name__}: {err}",
                  flush=True)
    import trl

    Path(out_path).write_text(json.dumps({"method": method, "runs": runs, "error": error, "skipped": skipped,
                                          "trl_path": os.path.dirname(trl.__file__)}))


# ---------------------------------------------------------------------------------------------------------------------
# The driver


def _median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def summarize(result: dict, a) -> dict:
    runs = result["runs"]
    reached = [r["updates_to_target"] for r in runs]
    return {
        "method": result["method"], "name": METHODS[result["method"]], "seeds": len(runs), "error": result["error"],
        "skipped": result.get("skipped", False),
        "trl_path": result.get("trl_path"),
        "informative_share": _median([r["informative_share"] for r in runs]),
        "informative_share_min": _median([r["informative_share_min"] for r in runs]),
        "predicted_share": _median([r["predicted_share"] for r in runs]),
        "generated_informative_share": _median([r["generated_informative_share"] for r in runs]),
        "answers_per_update": _median([r["answers_per_update"] for r in runs]),
        "rows_per_update": _median([r["rows_per_update"] for r in runs]),
        # a seed that never reached the target counts as +inf in the median
        "updates_to_target": _median([x if x is not None else math.inf for x in reached]) if runs else None,
        "seconds_to_target": _median([r["seconds_to_target"] if r["seconds_to_target"] is not None else math.inf
                                      for r in runs]) if runs else None,
        "seconds_per_update": _median([r["seconds_per_update"] for r in runs]),
        "updates_to_target_per_seed": reached,
        "seconds_to_target_per_seed": [r["seconds_to_target"] for r in runs],
        "crashed_in_update_per_seed": [r.get("crashed_in_update") for r in runs],
    }


def _fmt(x, spec):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return format(x, spec)


def format_table(summaries, a) -> str:
    G = a.group_size
    head = (f"{'learner':36s} {'inform.':>8s} {'min/upd':>8s} {'1-p^G-(1-p)^G':>14s} {'gen.inf.':>8s} "
            f"{'answers':>8s} {'rows':>6s} {'upd->95%':>9s} {'s->95%':>7s} {'s/upd':>6s}  per seed (updates)")
    lines = [f"Toy: 16 questions ({a.mastered} of them mastered at the start), G={G}, Adam lr {a.lr}, GRPO loss, "
             f"target accuracy {a.target} (exact policy accuracy after the update), {a.seeds} seeds, medians over "
             f"seeds, at most {a.max_updates} updates; selective sampling: window {a.selective_window}, "
             f"revisit_probability {a.revisit_probability}",
             head]
    for s in summaries:
        if s["error"] and not s["seeds"]:
            status = "NOT RUN (not in this TRL)" if s["skipped"] else "FAILED"
            lines.append(f"{'(' + s['method'] + ') ' + s['name']:36s} {status}: {s['error'].splitlines()[0]}")
            continue
        lines.append(
            f"{'(' + s['method'] + ') ' + s['name']:36s} {_fmt(s['informative_share'], '8.1%')} "
            f"{_fmt(s['informative_share_min'], '8.1%')} {_fmt(s['predicted_share'], '14.1%')} "
            f"{_fmt(s['generated_informative_share'], '8.1%')} {_fmt(s['answers_per_update'], '8.1f')} "
            f"{_fmt(s['rows_per_update'], '6.1f')} {_fmt(s['updates_to_target'], '9.0f')} "
            f"{_fmt(s['seconds_to_target'], '7.1f')} {_fmt(s['seconds_per_update'], '6.2f')}  "
            f"{s['updates_to_target_per_seed']}")
        if any(s["crashed_in_update_per_seed"]):
            lines.append(f"{'':36s} CRASHED in update {s['crashed_in_update_per_seed']} (per seed): "
                         f"{s['error'].splitlines()[0]}; figures above cover the updates before the crash")
    lines += [
        "inform.: share of rows reaching the loss with a non-zero advantage (= informative groups, binary reward), "
        "mean over updates; min/upd: its lowest single update",
        "1-p^G-(1-p)^G: the share expected without filtering from the policy before each update, mean over updates; "
        "gen.inf.: share of generated groups that were informative (before filtering)",
        "answers: generated answers per update (all sampling rounds); rows: rows trained on per update; "
        "s->95%: wall-clock seconds from the start of training; s/upd: seconds per update",
    ]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    p.add_argument("--max-updates", type=int, default=150)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--max-sampling-rounds", type=int, default=3, help="for (a); 0 = RLVRTrainer's 'unlimited'")
    p.add_argument("--replay-buffer-size", type=int, default=64, help="for (c); TRL's default")
    p.add_argument("--revisit-probability", type=float, default=0.25, help="for (d), (e), (g)")
    p.add_argument("--selective-window", type=int, default=2, help="for (d), (e), (g)")
    p.add_argument("--mastered", type=int, default=0, help="questions 0..N-1 start mastered (see build_policy_for)")
    p.add_argument("--mastered-logit", type=float, default=6.0)
    p.add_argument("--shaping", type=float, default=0.0,
                   help="add a reward -SHAPING x length / LMAX (the success reward stays the first-token one); "
                        "(h) filters on the success reward only")
    p.add_argument("--keep-going", action="store_true", help="run --max-updates even after the target is reached")
    p.add_argument("--methods", nargs="+", default=["a", "b", "c", "d", "e", "f", "g"], choices=list(METHODS))
    p.add_argument("--replay-trl", default=os.environ.get("RLVR_REPLAY_TRL"),
                   help="folder holding the trl/ package of a release with grpo_with_replay_buffer (e.g. 1.13.0)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="write the summary, every run and its per-update records here")
    p.add_argument("--table", help="write the printed table here too")
    p.add_argument("--smoke", action="store_true",
                   help="seconds: one seed, 2 updates, every learner in this process (TRL imported once)")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.smoke:
        a.seeds, a.max_updates, a.keep_going = 1, 2, True

    if a._worker:
        worker(a._worker, a, a._out)
        return 0

    command = "python -m benchmarks.dynamic_sampling " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(command, flush=True)
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="dynamic_sampling_bench_")
    shared = [f"--seeds={a.seeds}", f"--max-updates={a.max_updates}", f"--group-size={a.group_size}",
              f"--lr={a.lr}", f"--target={a.target}", f"--max-sampling-rounds={a.max_sampling_rounds}",
              f"--replay-buffer-size={a.replay_buffer_size}", f"--revisit-probability={a.revisit_probability}",
              f"--selective-window={a.selective_window}", f"--shaping={a.shaping}", f"--mastered={a.mastered}",
              f"--mastered-logit={a.mastered_logit}"] + (
                  ["--keep-going"] if a.keep_going else [])
    results: dict = {}
    gate = threading.Semaphore(max(1, a.workers))

    def launch(method):
        if a.smoke:  # in this process: no interpreter start and TRL import per learner
            out = os.path.join(tmp, f"{method}.json")
            worker(method, a, out)
            results[method] = json.loads(Path(out).read_text())
            return
        with gate:
            env = dict(os.environ)
            if method == "c" and a.replay_trl:
                env["PYTHONPATH"] = os.pathsep.join([str(Path(a.replay_trl).resolve()), env.get("PYTHONPATH", "")])
            out = os.path.join(tmp, f"{method}.json")
            proc = subprocess.run([sys.executable, "-m", __spec__.name, f"--_worker={method}", f"--_out={out}", *shared],
                                  env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
            if os.path.exists(out):
                results[method] = json.loads(Path(out).read_text())
            else:
                results[method] = {"method": method, "runs": [], "trl_path": None,
                                   "error": f"worker exited {proc.returncode}: {proc.stderr[-2000:]}"}

    if a.smoke:
        for m in a.methods:
            launch(m)
    threads = [] if a.smoke else [threading.Thread(target=launch, args=(m,)) for m in a.methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    summaries = [summarize(results[m], a) for m in a.methods]
    table = format_table(summaries, a)
    for s in summaries:
        if s["error"]:
            table += f"\n({s['method']}) error: {s['error'].strip()}"
        if s["method"] == "c" and s["trl_path"] and not s["skipped"]:
            table += f"\n(c) ran with the trl package at {s['trl_path']}"
    load = os.getloadavg()
    table += (f"\ntotal wall time {wall:.0f} s, {a.workers} worker process(es) at a time; load average at the end "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min) on {os.cpu_count()} cores")
    print(table)
    if a.table:
        Path(a.table).write_text(command + "\n" + table + "\n")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        settings = {k: v for k, v in vars(a).items() if not k.startswith("_") and k not in ("json", "table")}
        Path(a.json).write_text(json.dumps({
            "command": command, "settings": settings, "wall_seconds": wall, "load_average_at_end": load,
            "summary": summaries, "runs": [r for m in a.methods for r in results[m]["runs"]],
        }, indent=1, allow_nan=True))
    return finish("benchmarks.dynamic_sampling", failures(summaries))


def failures(summaries: list[dict]) -> list[str]:
    """A learner that crashed, ran no seed, or reports an error (other than a trainer this TRL lacks) fails."""
    out = []
    for s in summaries:
        if s["skipped"]:
            continue
        if s["error"] or not s["seeds"] or any(s["crashed_in_update_per_seed"]):
            reason = (s["error"] or "no seed ran").strip().splitlines()[0]
            out.append(f"({s['method']}) {s['name']}: {reason}")
    return out


if __name__ == "__main__":
    sys.exit(main())
