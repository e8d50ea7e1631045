"""RLVRTrainer / RLVRConfig as drop-ins for GRPOTrainer / GRPOConfig: the same constructor, the same validation
order, and no more of TRL's and transformers' warnings than GRPOTrainer prints."""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="emulates TRL's CPU-only test fixture")
def test_config_runs_trls_post_init_before_judging_the_machine(monkeypatch, tmp_path):
    """TRL's test fixtures (and any code patching TRL's config the same way) set use_cpu=True inside GRPOConfig's
    __post_init__: a config built with TRL's defaults (bf16 on) must then be accepted on a CPU, as GRPOConfig is."""
    from trl import GRPOConfig

    from trl_rlvr import RLVRConfig

    trls_post_init = GRPOConfig.__post_init__

    def cpu_fixture(self):
        self.use_cpu = True
        trls_post_init(self)

    monkeypatch.setattr(GRPOConfig, "__post_init__", cpu_fixture)
    assert GRPOConfig(str(tmp_path)).use_cpu
    config = RLVRConfig(str(tmp_path), report_to="none")
    assert config.use_cpu and config.bf16


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_without_the_fixture_bf16_on_a_cpu_is_still_refused_naming_the_override(tmp_path):
    from trl_rlvr import RLVRConfig
    from trl_rlvr.checks.machine import UnusableSettingsError

    with pytest.raises(UnusableSettingsError, match=r"bf16=True \(TRL's default\).*--bf16 false"):
        RLVRConfig(str(tmp_path), report_to="none")


@pytest.mark.trl_contract
def test_the_constructor_has_grpo_trainers_signature():
    from trl import GRPOTrainer

    from trl_rlvr import RLVRTrainer

    ours = inspect.signature(RLVRTrainer.__init__).parameters
    trls = inspect.signature(GRPOTrainer.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in trls.values()
    ]


def _arguments(tmp_path):
    """Every GRPOTrainer argument, in its order; the dict environment_factory needs an 'environment' column that
    the dataset lacks, which the pre-load check must report (before the nonexistent model would be loaded)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from trl_rlvr import RLVRConfig

    args = RLVRConfig(str(tmp_path), bf16=False, use_cpu=True, report_to="none")
    values = dict(
        model=str(tmp_path / "no-such-model"), reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args, train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}), eval_dataset=None, processing_class=None,
        reward_processing_classes=None, callbacks=None, optimizers=(None, None), quantization_config=None,
        peft_config=None, tools=None, rollout_func=None, environment_factory={"calc": object, "web": object},
    )
    assert list(values) == list(inspect.signature(GRPOTrainer.__init__).parameters)[1:]
    return values


def test_every_argument_passed_by_position_reaches_the_pre_load_checks(tmp_path):
    from trl_rlvr import RLVRTrainer

    with pytest.raises(ValueError, match="column 'environment'"):
        RLVRTrainer(*_arguments(tmp_path).values())


def test_every_argument_passed_by_keyword_reaches_the_pre_load_checks(tmp_path):
    from trl_rlvr import RLVRTrainer

    with pytest.raises(ValueError, match="column 'environment'"):
        RLVRTrainer(**_arguments(tmp_path))


COUNT_WARNINGS = """
import collections, json, sys, warnings
warnings.simplefilter("default")  # Python's default filters, but DeprecationWarnings shown too: both trainers alike
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl_rlvr import RLVRTrainer
from trl_rlvr.testing import build_tiny_model, load_tokenizer

model_dir = str(build_tiny_model(sys.argv[2]))
trainer_class = {"grpo": GRPOTrainer, "rlvr": RLVRTrainer}[sys.argv[1]]
args = GRPOConfig(output_dir=sys.argv[3], max_steps=3, per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=6, bf16=False, use_cpu=True, report_to="none", logging_steps=1,
                  gradient_checkpointing=True, save_strategy="no", seed=0)
data = Dataset.from_dict({"prompt": [f"q{i}" for i in range(8)]})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    trainer = trainer_class(model_dir, reward_funcs=[lambda completions, **kw: [float(len(c) % 2) for c in completions]],
                            args=args, train_dataset=data, processing_class=load_tokenizer(model_dir))
    trainer.train()
counts = collections.Counter(
    f"{w.category.__name__}: {str(w.message)[:80]}" for w in caught
    if any(lib in w.filename for lib in ("/transformers/", "/trl/", "/accelerate/", "/torch/"))
)
print(json.dumps(counts))
"""


def _warnings_of(trainer: str, tmp_path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", COUNT_WARNINGS, trainer, str(tmp_path / f"model-{trainer}"), str(tmp_path / trainer)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_run_prints_trls_and_transformers_warnings_no_more_often_than_grpo_trainer(tmp_path):
    grpo, rlvr = _warnings_of("grpo", tmp_path), _warnings_of("rlvr", tmp_path)
    more = {message: (n, grpo.get(message, 0)) for message, n in rlvr.items() if n > grpo.get(message, 0)}
    assert not more, f"printed more often under RLVRTrainer (RLVRTrainer, GRPOTrainer): {more}"
    assert grpo, "the run printed no library warning at all: the count proves nothing"
