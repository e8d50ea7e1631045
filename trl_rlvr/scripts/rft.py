"""``trl-rlvr rft``: rejection-sampling fine-tuning: sample n answers per prompt, keep those the reward accepts,
fine-tune on them (TRL's SFTTrainer, assistant-only loss); with --iterations, expert iteration.

    trl-rlvr rft MODEL --dataset questions.jsonl --prompt_column prompt --n 8 --temperature 1.0 \
        --max_new_tokens 96 --reward boxed_math --output_dir rft_out

samples with the same back-ends as `trl-rlvr eval` (HF generate, or --vllm; with --environment, TRL's multi-turn
tool loop), accepts an answer when the success reward scores it >= --success_threshold (and a --format_reward, if
given, >= --format_threshold), writes the accepted conversations as a `datasets` dataset
(OUTPUT_DIR/iteration_<i>/accepted, save_to_disk), fine-tunes on them (OUTPUT_DIR/iteration_<i>/model) and writes
OUTPUT_DIR/rft_metrics.json. The library function:
trl_rlvr.supervised.rejection_sampling.rejection_sampling_fine_tune; docs/rft.md.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    from trl_rlvr.scripts.eval import (
        _add_data_arguments,
        _add_reward_arguments,
        _add_sampling_arguments,
        _add_tool_arguments,
        _add_vllm_arguments,
    )

    p = sub.add_parser("rft", help="rejection-sampling fine-tuning: sample, keep what the reward accepts, SFT on it",
                       usage="%(prog)s MODEL [--OPTION VALUE ...]", description=__doc__.replace("``", "`"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the model directory or hub id to sample from and fine-tune")
    _add_data_arguments(p)
    _add_reward_arguments(p)
    _add_sampling_arguments(p)
    _add_vllm_arguments(p)
    _add_tool_arguments(p)
    _add_rft_arguments(p)
    p.set_defaults(func=run, format_reward="none", k=None)
    return p


def _add_rft_arguments(parser: argparse.ArgumentParser) -> None:
    """What is accepted, how many rounds, and the SFT step."""
    r = parser.add_argument_group("rejection sampling (--n answers per prompt; --success_threshold accepts)")
    r.add_argument("--format_threshold", type=float, default=1.0, help="with --format_reward: its acceptance threshold")
    r.add_argument("--max_per_prompt", type=int, default=None, help="keep at most this many answers per prompt")
    r.add_argument("--keep_duplicates", action="store_true", help="keep an answer equal to one already kept")
    r.add_argument("--keep_unfinished", action="store_true", help="keep answers cut by the token budget")
    r.add_argument("--keep_failed_tool_calls", action="store_true", help="keep tool rollouts with a call that did "
                   "not parse or failed to run")
    r.add_argument("--iterations", type=int, default=1, help="rounds of sample -> accept -> fine-tune (expert "
                   "iteration), each sampling from the last round's model")
    r.add_argument("--continue_from_last", action="store_true", help="each round fine-tunes the last round's model "
                   "(default: the base model, on that round's answers: ReST-EM)")
    r.add_argument("--no_train", action="store_true", help="write the accepted dataset only (one round)")
    r.add_argument("--response_template", default=None, metavar="NAME", help="with --environment: the response "
                   "template TRL parses tool calls with, one of trl.chat_template_utils' NAME_template (e.g. qwen3 "
                   "for examples/chat_templates/chatml_tools.jinja); default: TRL's for the chat template it knows")
    s = parser.add_argument_group("SFT (TRL's SFTTrainer, assistant-only loss)")
    s.add_argument("--sft_epochs", type=float, default=2.0)
    s.add_argument("--sft_learning_rate", type=float, default=5e-5, help="constant, no warm-up")
    s.add_argument("--sft_batch_size", type=int, default=8, help="rows per optimizer step")
    s.add_argument("--sft_micro_batch_size", type=int, default=2, help="rows per forward pass")
    s.add_argument("--sft_max_length", type=int, default=512)
    s.add_argument("--bf16", action="store_true", help="SFT in bfloat16 mixed precision")
    o = parser.add_argument_group("output")
    o.add_argument("--output_dir", default="rft_out", help="iteration_<i>/accepted, iteration_<i>/model, "
                   "rft_metrics.json")


def settings_from_args(args):
    """(:class:`~trl_rlvr.supervised.rejection_sampling.RFTSettings`,
    :class:`~trl_rlvr.supervised.fine_tune.SFTSettings`) from the command line; ``ValueError`` naming the option."""
    import torch

    from trl_rlvr.supervised.fine_tune import SFTSettings
    from trl_rlvr.supervised.rejection_sampling import RFTSettings

    if args.k is not None:
        raise ValueError("--k: rft keeps the accepted answers, it reports no pass@k (use trl-rlvr eval)")
    if args.no_train and args.iterations != 1:
        raise ValueError(f"--no_train writes one round's dataset: --iterations {args.iterations} needs training")
    try:
        rft = RFTSettings(num_samples=args.n, threshold=args.success_threshold, format_threshold=args.format_threshold,
                          require_finished=not args.keep_unfinished,
                          require_clean_tool_calls=not args.keep_failed_tool_calls, unique=not args.keep_duplicates,
                          max_per_prompt=args.max_per_prompt, iterations=args.iterations,
                          restart_from_base=not args.continue_from_last, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                          max_tool_calling_iterations=args.max_tool_calling_iterations, seed=args.seed,
                          batch_size=args.batch_size)
        sft = SFTSettings(epochs=args.sft_epochs, learning_rate=args.sft_learning_rate, batch_size=args.sft_batch_size,
                          micro_batch_size=args.sft_micro_batch_size, max_length=args.sft_max_length, seed=args.seed,
                          use_cpu=not torch.cuda.is_available(), bf16=args.bf16, model_init_kwargs={"dtype": args.dtype})
    except ValueError as e:  # RFTSettings / SFTSettings name their field: say the option
        message = str(e).replace("RFT num_samples", "--n").replace("RFT threshold", "--success_threshold")
        raise ValueError(message.replace("RFT ", "--").replace("SFT ", "--sft_")) from None
    return rft, sft


def response_template(name: str) -> dict:
    """TRL's response template ``<name>_template`` (how it parses a model's tool calls); ``ValueError`` naming the
    option and the known names."""
    from trl import chat_template_utils

    known = sorted(n.removesuffix("_template") for n in dir(chat_template_utils)
                   if n.endswith("_template") and isinstance(getattr(chat_template_utils, n), dict))
    if name not in known:
        raise ValueError(f"--response_template {name!r}: not one of TRL's response templates {known}")
    return getattr(chat_template_utils, f"{name}_template")


def run(args) -> int:
    from trl_rlvr.evaluation.progress import plain_library_bars
    from trl_rlvr.scripts.eval import (
        default_prompt_style,
        eval_rewards,
        load_rows,
        load_vllm_engine,
        tool_options,
        with_prompts,
    )
    from trl_rlvr.scripts.models import load_tokenizer, resolve_model_path
    from trl_rlvr.supervised.rejection_sampling import rejection_sampling_fine_tune

    plain_library_bars()
    try:
        settings, sft = settings_from_args(args)
        args.prompt_style = default_prompt_style(args)
        tools = tool_options(args)
        success_fn, format_fn = eval_rewards(args)
        rows = load_rows(args)
        path = resolve_model_path(args.model)
        tokenizer = load_tokenizer(path)
        if tools.get("chat_template"):  # the rollouts and the SFT rows render with it
            tokenizer.chat_template = tools["chat_template"]
        if args.response_template is not None:
            tokenizer.response_template = response_template(args.response_template)
        report = rejection_sampling_fine_tune(
            path, tokenizer, with_prompts(rows, tokenizer, args.prompt_style), success_fn, args.output_dir, settings,
            sft, format_fn=format_fn, environment_factory=tools.get("environment_factory"),
            make_llm=(lambda p: load_vllm_engine(p, args)[0]) if args.vllm else None, train=not args.no_train,
            dtype=args.dtype,
        )
    except ValueError as e:
        print(f"trl-rlvr rft: error: {e}", file=sys.stderr)
        return 2
    print(f"metrics: {args.output_dir}/rft_metrics.json   model: {report['model']}")
    return 0
