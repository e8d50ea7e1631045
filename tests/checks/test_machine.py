"""Settings the machine cannot run (trl_rlvr.checks.machine): one error naming every override, before any model loads."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from trl_rlvr.checks.machine import Machine, UnusableSettingsError, check_machine, unusable_settings

ROOT = Path(__file__).resolve().parents[2]
CPU = Machine(bf16=False, fp16=False, vllm=False)


def settings(**kw):
    return SimpleNamespace(**{"bf16": None, "fp16": False, "use_cpu": False, "use_vllm": False,
                              "vllm_mode": "colocate", **kw})


def test_a_gpu_recipe_on_a_cpu_names_every_override_at_once():
    problems, overrides = unusable_settings(settings(bf16=True, use_vllm=True), CPU)
    assert overrides == {"bf16": False, "use_vllm": False} and len(problems) == 2
    with pytest.raises(UnusableSettingsError, match=r"Override them: --bf16 false --use_vllm false .* "
                                                     r"bf16=False, use_vllm=False in Python"):
        check_machine(settings(bf16=True, use_vllm=True), CPU)


def test_trls_bf16_default_counts_and_use_cpu_or_a_gpu_lets_it_run():
    assert "TRL's default" in unusable_settings(settings(), CPU)[0][0]
    assert unusable_settings(settings(bf16=True, use_cpu=True), CPU) == ([], {})
    assert unusable_settings(settings(bf16=True, use_vllm=True), Machine(bf16=True, fp16=True, vllm=True)) == ([], {})
    assert unusable_settings(settings(bf16=False, fp16=True), CPU)[1] == {"fp16": False}


def test_the_error_is_both_an_import_error_and_a_value_error():
    err = UnusableSettingsError(["x"], {"use_vllm": False})
    assert isinstance(err, ImportError) and isinstance(err, ValueError)


def test_trl_rlvr_train_of_a_gpu_recipe_on_a_cpu_stops_with_one_message(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from trl_rlvr.scripts.cli import main

    code = main(["train", "--config", str(ROOT / "examples" / "recipes" / "dr_grpo.yaml"), "--model_name_or_path",
                 str(tmp_path / "no-model"), "--output_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("trl-rlvr train: error: This machine cannot run these settings")
    assert "--bf16 false --use_vllm false" in err and "Traceback" not in err


def test_the_cpu_thread_default_is_every_core_whatever_the_load(monkeypatch):
    """A seeded run's thread count does not depend on what ran before it (the 1-minute load average lags)."""
    import torch

    from trl_rlvr.checks.machine import default_cpu_threads
    from trl_rlvr.scripts.train import use_cpu_threads

    assert default_cpu_threads(2) == 2 and default_cpu_threads(16) == 16 and default_cpu_threads(1) == 1
    with pytest.raises(ValueError, match="cores"):
        default_cpu_threads(0)
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the CPU thread count is left alone")
    before = torch.get_num_threads()
    try:
        cores = len(os.sched_getaffinity(0))
        for load in (0.0, 1.2, 15.0):
            monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
            torch.set_num_threads(1)
            use_cpu_threads(None, 1)
            assert torch.get_num_threads() == cores
        use_cpu_threads(1, 1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("given, expected", [
    ({}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000"}),  # a short spin, then sleep
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}),  # the user's policy
    ({"GOMP_SPINCOUNT": "0"}, {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "0"}),  # the user's spin count
])
def test_openmp_waits_spin_briefly_unless_the_environment_says_otherwise(monkeypatch, given, expected):
    from trl_rlvr.scripts.train import passive_openmp_waits

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    passive_openmp_waits()
    assert {name: os.environ.get(name) for name in expected} == expected
