"""Warnings raised while a config is built point at the line that built it (``stacklevel``), not at trl_rlvr's."""

import tempfile
import warnings

import pytest


@pytest.mark.parametrize("fields, message", [
    ({"max_sampling_rounds": 5}, "has no effect without dynamic_sampling"),
    ({"bf16": True}, "bf16=True on a CPU"),
    ({"steps_per_generation": 3, "gradient_accumulation_steps": 2}, "is exact when steps_per_generation"),
])
def test_config_warnings_point_at_the_users_line(fields, message, monkeypatch):
    from trl_rlvr import RLVRConfig
    from trl_rlvr.checks import settings as checks

    monkeypatch.setattr(checks, "_warned_bf16_on_cpu", False)  # said once per process

    settings = dict(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none",
                    per_device_train_batch_size=4, num_generations=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RLVRConfig(**{**settings, **fields})
    ours = [w for w in caught if message in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert ours[0].filename == __file__, ours[0].filename
