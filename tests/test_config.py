"""RLVRConfig's choice checks come from its fields' metadata: every field that lists ``choices`` refuses any other
value, naming the field, the value and the choices (the same message the command line's help lists them in)."""

import dataclasses
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _fields_with_choices():
    from trl import GRPOConfig

    from trl_rlvr import RLVRConfig

    inherited = GRPOConfig.__dataclass_fields__
    return {
        f.name: list(f.metadata["choices"]) for f in dataclasses.fields(RLVRConfig)
        if "choices" in f.metadata and inherited.get(f.name) is not f
    }


CHOICES = _fields_with_choices()
OUTPUT_DIR = tempfile.mkdtemp()


def build(**fields):
    from trl_rlvr import RLVRConfig

    return RLVRConfig(output_dir=OUTPUT_DIR, use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=4, num_generations=4, **fields)


def test_the_fields_with_choices_are_the_switches_that_name_one():
    """The scan sees the switches (a scan that found none would make the property below vacuous)."""
    assert {"loss_normalization", "advantage_baseline", "advantage_std", "token_count_scope",
            "dynamic_sampling_metric", "dynamic_sampling_partial_batch", "void_turn_action",
            "tool_error_reply"} <= set(CHOICES)


@pytest.mark.filterwarnings("ignore:.*has no effect:UserWarning")
@pytest.mark.parametrize("name", sorted(CHOICES))
def test_every_choice_is_accepted(name):
    for value in CHOICES[name]:
        extra = {"importance_sampling_level": "sequence"} if value == "luspo" else {}
        assert getattr(build(**{name: value}, **extra), name) == value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_value_outside_the_choices_is_refused_naming_field_value_and_choices(data):
    name = data.draw(st.sampled_from(sorted(CHOICES)), label="field")
    value = data.draw(st.text(max_size=12).filter(lambda v: v not in CHOICES[name]), label="value")
    with pytest.raises(ValueError) as refused:
        build(**{name: value})
    allowed = ", ".join(map(repr, CHOICES[name]))
    assert str(refused.value) == f"{name}={value!r} is not valid; allowed values: {allowed}"
