"""Every built-in with options has one shape, TRL's ``get_soft_overlong_punishment``: a factory whose own keyword
signature and docstring are the options, returning a callable class that holds no defaults of its own."""

import inspect
import pickle

import pytest

from reward_plugins.boxed_math import BoxedMathReward, boxed_math
from reward_plugins.code_sandbox import CodeSandboxReward, code_sandbox
from reward_plugins.think_format import ThinkFormatReward, think_format

BUILTINS = {"boxed_math": (boxed_math, BoxedMathReward), "think_format": (think_format, ThinkFormatReward),
            "code_sandbox": (code_sandbox, CodeSandboxReward)}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_the_factory_signature_is_its_own_and_the_class_holds_no_defaults(name):
    factory, cls = BUILTINS[name]
    assert "__signature__" not in vars(factory)  # no patched signature: what the registry reads is written there
    options = inspect.signature(factory).parameters
    assert options and all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not p.empty for p in options.values())
    assert inspect.signature(factory).return_annotation in (cls, cls.__name__)
    init = dict(inspect.signature(cls.__init__).parameters)
    init.pop("self")
    assert list(init) == list(options)  # the factory passes every option on
    assert all(p.default is p.empty for p in init.values())  # the defaults are written once, in the factory
    assert all(f"    {o}:" in factory.__doc__ for o in options)  # each option documented where it is declared


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_option_reaches_the_reward_and_survives_pickling(name):
    factory, cls = BUILTINS[name]
    given = {
        "think_format": {"think_tag": "reason", "answer_tag": "answer", "prefilled": True},
        "boxed_math": {"think_tag": "reason", "prestart": False, "gold_column": "gold", "max_answer_chars": 99,
                       "num_workers": 2, "timeout": 2.0, "prefilled": True, "answer_line": True, "memory_limit_mb": 512},
        "code_sandbox": {"think_tag": "reason", "isolation": "rlimits", "partial_credit": True, "prompt_code_column": "pc"},
    }[name]  # fmt: skip
    f = factory(**given)
    assert isinstance(f, cls) and f.__name__ == name
    back = pickle.loads(pickle.dumps(f))
    for option, value in given.items():
        if option in vars(f):
            assert getattr(f, option) == value == getattr(back, option), option


@pytest.mark.parametrize("name", sorted(BUILTINS))
@pytest.mark.parametrize("tag", ["<think>", "", "a b", None])
def test_think_tag_is_a_bare_tag_name_everywhere(name, tag):
    factory, _ = BUILTINS[name]
    extra = {"boxed_math": {"prestart": False}, "code_sandbox": {"isolation": "rlimits"}}.get(name, {})
    with pytest.raises(ValueError, match=f"{name}: think_tag must be a bare tag name"):
        factory(think_tag=tag, **extra)
