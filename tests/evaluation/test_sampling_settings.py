"""One sampling settings object (trl_rlvr.evaluation.generation.SamplingSettings) for the three generation back-ends:
HF generate, tool rollouts and vLLM take it as ``sampling=`` (or its fields as keywords), and name none of its fields
themselves."""

import dataclasses
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.evaluation.generation import SamplingSettings, generate_completions, row_seed
from trl_rlvr.evaluation.tool_rollouts import generate_tool_completions
from trl_rlvr.evaluation.vllm_generation import generate_completions_vllm

FIELDS = {f.name for f in dataclasses.fields(SamplingSettings)}
BACK_ENDS = (generate_completions, generate_tool_completions, generate_completions_vllm)


@pytest.mark.parametrize("back_end", BACK_ENDS, ids=lambda f: f.__name__)
def test_every_back_end_takes_the_settings_object_and_names_none_of_its_fields(back_end):
    params = inspect.signature(back_end).parameters
    assert "sampling" in params and not FIELDS & set(params)
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # the keyword form


@settings(max_examples=50, deadline=None)
@given(greedy=st.booleans(), temperature=st.floats(0.1, 2.0), top_p=st.floats(0.1, 1.0), top_k=st.integers(0, 50),
       max_new_tokens=st.integers(1, 512), seed=st.integers(0, 2**31), question=st.integers(0, 999),
       sample=st.integers(0, 63))
def test_resolve_the_keywords_or_the_object_and_name_each_samples_stream(greedy, temperature, top_p, top_k,
                                                                       max_new_tokens, seed, question, sample):
    keywords = dict(greedy=greedy, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                    seed=seed)
    made = SamplingSettings.resolve(**keywords)
    assert made == SamplingSettings(**keywords) and SamplingSettings.resolve(made) is made
    assert made.stream(question, sample) == (None if greedy else row_seed(seed, question, sample))
    assert made.sampler() == dict(temperature=temperature, top_p=top_p, top_k=top_k)


def test_resolve_refuses_both_forms_and_unknown_keywords():
    with pytest.raises(TypeError, match="not both"):
        SamplingSettings.resolve(SamplingSettings(), temperature=0.5)
    with pytest.raises(TypeError):
        SamplingSettings.resolve(temprature=0.5)  # a typo is an error, not a default
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(temperature=0.0).check("here", ["p"], [0], 2)
    with pytest.raises(ValueError, match="greedy"):
        SamplingSettings(greedy=True).check("here", ["p"], [0], 2)


@pytest.mark.slow
def test_the_object_and_the_keywords_give_the_same_completions(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from trl_rlvr.testing import load_tokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts, ids = ["What is 2 + 3?", "Say hi."], [0, 1]
    by_object = generate_completions(model, tokenizer, prompts, ids, 3,
                                     sampling=SamplingSettings(temperature=0.7, top_k=5, max_new_tokens=6, seed=4))
    by_keywords = generate_completions(model, tokenizer, prompts, ids, 3, temperature=0.7, top_k=5, max_new_tokens=6,
                                       seed=4)
    assert by_object == by_keywords
