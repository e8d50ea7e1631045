"""``trl-rlvr`` command line: ``trl-rlvr train --config recipe.yaml [--field value ...]`` (:mod:`trl_rlvr.scripts.train`),
``trl-rlvr doctor --config recipe.yaml`` (:mod:`trl_rlvr.scripts.doctor`),
``trl-rlvr eval MODEL ...`` (:mod:`trl_rlvr.scripts.eval`), ``trl-rlvr rft MODEL ...`` (:mod:`trl_rlvr.scripts.rft`),
``trl-rlvr rewards list``, ``trl-rlvr rewards show NAME``
and ``trl-rlvr rewards audit NAME`` (:mod:`trl_rlvr.audit`)."""

from __future__ import annotations

import argparse
import sys


def _rewards_list(args: argparse.Namespace) -> int:
    from trl_rlvr.rewards.registry import available_rewards, reward_specs

    specs = reward_specs()
    if not specs:
        print("No reward plugins installed (entry-point group 'trl_rlvr.rewards').")
        return 0
    descriptions = available_rewards()
    rows = [(name, descriptions[name], f"{s.package} {s.version}") for name, s in specs.items()]
    w0 = max(len("NAME"), *(len(r[0]) for r in rows))
    w2 = max(len("PACKAGE"), *(len(r[2]) for r in rows))
    print(f"{'NAME':<{w0}}  {'PACKAGE':<{w2}}  DESCRIPTION")
    for name, desc, pkg in rows:
        print(f"{name:<{w0}}  {pkg:<{w2}}  {desc}")
    return 0


def _rewards_show(args: argparse.Namespace) -> int:
    from trl_rlvr.rewards.registry import RewardPluginError, describe_reward

    try:
        info = describe_reward(args.name)
    except (ValueError, RewardPluginError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{info['name']}: {info['description']}")
    print(f"  package:     {info['package']} {info['version']}")
    print(f"  entry point: {info['entry_point']}")
    print("  options:" if info["options"] else "  options: (none)")
    for opt, o in info["options"].items():
        default = "(required)" if o["required"] else f"= {o['default']!r}"
        ann = f" [{o['annotation']}]" if o["annotation"] else ""
        print(f"    {opt}{ann} {default}")
    if info["accepts_any_option"]:
        print("    (accepts any other keyword option)")
    doc = info["doc"].split("\n", 1)
    if len(doc) > 1 and doc[1].strip():
        print()
        print(doc[1].strip("\n"))
    print()
    print(f'Use: load_reward("{info["name"]}", **options), or reward_funcs=["{info["name"]}"] in RLVRTrainer.')
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command but ``train`` and ``doctor`` (each has its own: :mod:`trl_rlvr.scripts.recipe_help`).
    Each command's ``--help`` says first what it does; nothing here imports TRL or torch."""
    from trl_rlvr import __version__

    parser = argparse.ArgumentParser(
        prog="trl-rlvr", description="RLVR on Hugging Face TRL: train from a recipe, check a recipe on one real batch "
        "before training, evaluate models with pass@k and the training rewards, fine-tune on the answers a reward "
        "accepts (rejection sampling), list, show and audit reward plugins. "
        "`trl-rlvr COMMAND --help` says what each command does and lists its options.")
    parser.add_argument("--version", action="version", version=f"trl-rlvr {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("train", add_help=False, help="train from a recipe: trl-rlvr train --config recipe.yaml "
                   "[--field value ...] (--help: its options; --help-all: every field)")
    sub.add_parser("doctor", add_help=False, help="check a recipe on one real batch before training: trl-rlvr "
                   "doctor --config recipe.yaml [--field value ...] [--json report.json]")
    rewards = sub.add_parser(
        "rewards", help="reward plugins: list, show, audit",
        description="Reward plugins: the built-ins and those other packages register in the entry-point group "
        "trl_rlvr.rewards. `list` names them, `show NAME` prints one with its options, `audit NAME` runs hostile "
        "and labeled cases through one (can it be gamed?).")
    rsub = rewards.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = rsub.add_parser("list", help="list the installed reward plugins",
                        description="List the installed reward plugins (built-ins and third-party entry points): "
                        "name, package and version, description.")
    p.set_defaults(func=_rewards_list)
    p = rsub.add_parser("show", help="show one reward plugin and its options",
                        description="Show one reward plugin: its description, package, entry point, options with "
                        "their defaults, and its documentation; how to use it in RLVRTrainer or load_reward.")
    p.add_argument("name", help="a registered reward name (`trl-rlvr rewards list`)")
    p.set_defaults(func=_rewards_show)
    from trl_rlvr.scripts.audit import add_parser as add_audit_parser

    add_audit_parser(rsub)
    from trl_rlvr.scripts.eval import add_parser as add_eval_parser

    add_eval_parser(sub)
    from trl_rlvr.scripts.rft import add_parser as add_rft_parser

    add_rft_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # its own parser: every RecipeArguments, RLVRConfig and ModelConfig field
        from trl_rlvr.scripts.recipe_help import wants_help

        if wants_help(argv[1:]) == "short":  # before anything imports TRL: well under a second
            from trl_rlvr.scripts.train import help_text

            print(help_text(), end="")
            return 0
        from trl_rlvr.checks.machine import UnusableSettingsError
        from trl_rlvr.faults import UnusableCheckpointError
        from trl_rlvr.scripts.data_fit import RecipeDataError
        from trl_rlvr.scripts.train import main as train_main

        try:
            train_main(argv[1:])
        except (UnusableSettingsError, RecipeDataError, UnusableCheckpointError) as e:  # the fix is in the message
            print(f"trl-rlvr train: error: {e}", file=sys.stderr)
            return 2
        return 0
    if argv[:1] == ["doctor"]:  # the train command's parser, plus --json (trl_rlvr.scripts.doctor)
        from trl_rlvr.scripts.doctor import main as doctor_main

        return doctor_main(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
