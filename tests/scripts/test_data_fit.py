"""A recipe's sizes against its data (trl_rlvr.scripts.data_fit): each field that cannot fit is named, before the
model loads."""

import json
from types import SimpleNamespace

from trl_rlvr.scripts.data_fit import fit_problems


def recipe(**kw):
    return SimpleNamespace(**{"dataset_name": "qa.jsonl", "dataset_test_split": "test", "num_eval_samples": 100,
                              "num_train_samples": None, **kw})


def test_num_eval_samples_carved_out_of_a_small_train_split_is_named():
    errors, _ = fit_problems(recipe(num_eval_samples=500), 2, {"train_rows": 32, "test_rows": None, "carved": True})
    assert len(errors) == 1
    assert errors[0].startswith("num_eval_samples=500 does not fit: qa.jsonl has no held-out split 'test'")
    assert "--num_eval_samples 3" in errors[0]


def test_too_few_training_questions_for_one_generation_batch():
    errors, _ = fit_problems(recipe(num_eval_samples=28), 8, {"train_rows": 32, "test_rows": None, "carved": True})
    assert errors and "4 training questions" in errors[0] and "per_device_train_batch_size" in errors[0]
    errors, _ = fit_problems(recipe(dataset_name=None, num_train_samples=4), 8,
                             {"train_rows": None, "test_rows": None, "carved": False})
    assert errors and "built-in arithmetic data" in errors[0]


def test_caps_above_the_data_only_warn_and_sizes_that_fit_pass():
    errors, notes = fit_problems(recipe(num_train_samples=100, num_eval_samples=50), 2,
                                 {"train_rows": 40, "test_rows": 10, "carved": False})
    assert errors == [] and len(notes) == 2
    assert "num_eval_samples=50 is more than the 10 rows" in notes[0] and "num_train_samples=100" in notes[1]
    assert fit_problems(recipe(), 2, {"train_rows": 400, "test_rows": None, "carved": True}) == ([], [])


def test_trl_rlvr_train_names_num_eval_samples_before_the_model_loads(tmp_path, capsys):
    from trl_rlvr.scripts.cli import main

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n"
                            for i in range(32)))
    code = main(["train", "--model_name_or_path", str(tmp_path / "no-model"), "--dataset_name", str(data),
                 "--num_eval_samples", "500", "--use_cpu", "true", "--bf16", "false", "--output_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "num_eval_samples=500 does not fit" in err and "test_size" not in err
