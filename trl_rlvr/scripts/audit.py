"""``trl-rlvr rewards audit NAME [--option value ...] [--kind K] [--cases my.jsonl] [--json PATH]``.

Runs the corpus of hostile and labeled cases of the reward's kind through a registered reward (``trl-rlvr rewards
list``) or a ``module:function`` reward, and prints per class the wrong answers it accepted (false positives), the
right answers it rejected (false negatives), errors, timeouts and the cost. Any option not listed below is an
option of the reward (``--timeout 2``; the value is read as JSON, else as a string).

Exit status: 0 when the audit passes (no false positive, no error, no timeout, at least --min_right_rate of the
right answers accepted), 1 when it fails, 2 when it cannot run (unknown reward or option, a bad corpus line).
Guide: docs/auditing_rewards.md.
"""

from __future__ import annotations

import argparse
import json
import sys


def _flags(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    from trl_rlvr.audit.cases import KINDS

    p.add_argument("--kind", choices=KINDS, default=d(None),
                   help="the corpus to run, for a reward that declares no reward_kind (or to override it)")
    p.add_argument("--cases", action="append", default=d([]), metavar="FILE.jsonl",
                   help="your own cases (the corpus schema), run after the built-in corpus; repeatable")
    p.add_argument("--only_cases", action="store_true", default=d(False), help="run only --cases, not the built-in corpus")
    p.add_argument("--json", default=d(None), metavar="PATH", help="write the report as JSON")
    p.add_argument("--deadline", type=float, default=d(30.0), help="seconds one case may take (default 30)")
    p.add_argument("--startup_deadline", type=float, default=d(120.0),
                   help="seconds the reward may take to start and score its first case (default 120)")
    p.add_argument("--threshold", type=float, default=d(1.0), help="a score at or above it accepts (default 1.0)")
    p.add_argument("--min_right_rate", type=float, default=d(0.9),
                   help="share of the right answers that must be accepted (default 0.9)")
    p.add_argument("--messages", action="store_true", default=d(False),
                   help="pass completions as conversations (TRL's own rewards read them so)")
    p.add_argument("--column", action="append", default=d([]), metavar="CORPUS=YOURS",
                   help="rename a corpus column for a reward that reads another name (solution=answer)")
    p.add_argument("--no_progress", action="store_true", default=d(False), help="no progress bar")
    p.add_argument("--seed", type=int, default=d(None),
                   help="seed of the variants, groups and order (default: fresh per run, printed in the report)")
    p.add_argument("--variants", type=int, default=d(3), help="metamorphic variants per case (default 3; 0: none)")
    p.add_argument("--group_size", type=int, default=d(4), help="completions per group, as num_generations (default 4)")
    p.add_argument("--tokenizer", default=d(None), metavar="T",
                   help="the tokenizer of the run the reward is for, for completion_ids: a tokenizer.json, a model "
                        "directory, a hub id or smollm2 (default: none; a BPE drawn per audit, as the report says)")


def add_parser(rsub) -> argparse.ArgumentParser:
    """The ``audit`` action of ``trl-rlvr rewards``."""
    p = rsub.add_parser("audit", help="run hostile and labeled cases through a reward: can it be gamed?",
                        usage="%(prog)s NAME [--OPTION VALUE ...] [--kind K] [--cases my.jsonl] [--json PATH]",
                        description=__doc__.split("\n\n", 1)[1].replace("``", "`"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a registered reward name or module:function")
    _flags(p)
    p.add_argument("reward_options", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=run, audit_parser=p)
    return p


def parse_reward_options(items: list[str]) -> dict:
    """``["--timeout", "2", "--prefilled=true"]`` -> ``{"timeout": 2, "prefilled": True}`` (JSON, else a string)."""
    out, k = {}, 0
    while k < len(items):
        item = items[k]
        if not item.startswith("--") or len(item) == 2:
            raise ValueError(f"unexpected argument {item!r}: reward options are written --option value")
        key, eq, value = item[2:].partition("=")
        if not eq:
            if k + 1 >= len(items):
                raise ValueError(f"reward option --{key} needs a value")
            value, k = items[k + 1], k + 1
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
        k += 1
    return out


def run(args: argparse.Namespace) -> int:
    from trl_rlvr.audit import CorpusError, RewardStartError, audit_reward

    if {"-h", "--help"} & set(args.reward_options):
        args.audit_parser.print_help()
        return 0
    rest = argparse.ArgumentParser(add_help=False)
    _flags(rest, defaults=False)
    try:
        args, unknown = rest.parse_known_args(args.reward_options, namespace=args)
        options = parse_reward_options(unknown)
        columns = dict(c.split("=", 1) for c in args.column if "=" in c)
        if len(columns) != len(args.column):
            raise ValueError(f"--column takes CORPUS=YOURS, got {args.column}")
        report = audit_reward(
            args.name, options=options, kind=args.kind, cases=args.cases, builtin=not args.only_cases,
            deadline=args.deadline, startup_deadline=args.startup_deadline, threshold=args.threshold,
            min_right_rate=args.min_right_rate, messages=args.messages, columns=columns,
            progress=not args.no_progress and sys.stderr.isatty(), seed=args.seed, variants=args.variants,
            group_size=args.group_size, tokenizer=_tokenizer(args.tokenizer))
    except (ValueError, CorpusError, RewardStartError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report.render()
    if args.json:
        report.write_json(args.json)
    return 0 if report.passed else 1


def _tokenizer(source: str | None) -> str | None:
    """``--tokenizer``: ``smollm2`` (and its aliases) -> the offline default model's directory; else as given."""
    from trl_rlvr.scripts.models import SMOLLM2_ALIASES, resolve_model_path

    return resolve_model_path(source, quiet=True) if source and source.lower() in SMOLLM2_ALIASES else source
