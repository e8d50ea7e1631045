"""Whether a recipe's sizes fit its data, checked on the raw dataset before the tokenizer or the model loads.

Every size that cannot fit is named with the recipe field that sets it, in one :class:`RecipeDataError`:

- ``num_eval_samples`` when the held-out questions are carved out of the training split (the dataset has no
  ``dataset_test_split``) and it leaves no training row (``datasets`` would say ``test_size=... should be ...
  smaller than the number of samples``);
- the training questions left (``num_train_samples``, the dataset's rows) against the prompts one generation
  batch draws: ``generation_batch_size / num_generations`` (per_device_train_batch_size x steps_per_generation x
  processes / num_generations).

A cap larger than what the data holds (``num_train_samples``, ``num_eval_samples`` above the split's rows) only
takes all the rows; it warns, naming the field.
"""

from __future__ import annotations

import warnings


class RecipeDataError(ValueError):
    """A recipe whose sizes do not fit its data (the message names each field)."""


def data_sizes(recipe, raw) -> dict:
    """``{"train_rows", "test_rows", "carved"}``: the rows of the train split, of the held-out split (None when it
    is carved out of train) and whether it is carved. ``raw``: the ``DatasetDict`` of ``load_raw_data`` (None for
    the built-in data, which is generated to size)."""
    if raw is None:
        return {"train_rows": None, "test_rows": None, "carved": False}
    split = recipe.dataset_test_split
    has_test = bool(split) and split in raw
    return {"train_rows": len(raw[recipe.dataset_train_split]), "test_rows": len(raw[split]) if has_test else None,
            "carved": not has_test}


def fit_problems(recipe, prompts_per_batch: int, sizes: dict) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the recipe's sizes against ``sizes`` (:func:`data_sizes`); pure."""
    errors, notes = [], []
    name = recipe.dataset_name or "the built-in arithmetic data"
    train_rows, n_eval = sizes["train_rows"], recipe.num_eval_samples
    if train_rows is None:  # built-in data: exactly num_train_samples (default 256) questions
        available = recipe.num_train_samples or 256
    elif sizes["carved"]:
        carved = n_eval if n_eval else max(1, round(0.1 * train_rows))
        if n_eval and n_eval >= train_rows:
            errors.append(
                f"num_eval_samples={n_eval} does not fit: {name} has no held-out split "
                f"{recipe.dataset_test_split!r} (dataset_test_split), so the held-out questions are carved out of "
                f"its {train_rows} training rows and none would be left to train on; "
                + (f"set --num_eval_samples below {train_rows} (e.g. --num_eval_samples {max(1, train_rows // 10)}) "
                   "or name a held-out split" if train_rows > 1 else "name a held-out split"))
            return errors, notes
        available = train_rows - carved
    else:
        available = train_rows
        if n_eval and n_eval > sizes["test_rows"]:
            notes.append(f"num_eval_samples={n_eval} is more than the {sizes['test_rows']} rows of {name}'s split "
                         f"{recipe.dataset_test_split!r}: all {sizes['test_rows']} are used")
    if recipe.num_train_samples is not None and train_rows is not None and recipe.num_train_samples > available:
        notes.append(f"num_train_samples={recipe.num_train_samples} is more than the {available} training rows of "
                     f"{name}: all {available} are used")
        available_train = available
    else:
        available_train = min(available, recipe.num_train_samples or available)
    if available_train < prompts_per_batch:
        errors.append(
            f"{available_train} training questions (num_train_samples={recipe.num_train_samples}, {name}) are fewer "
            f"than the {prompts_per_batch} prompts one generation batch draws (per_device_train_batch_size x "
            "steps_per_generation x processes / num_generations): give more questions, or lower "
            "per_device_train_batch_size or steps_per_generation, or raise num_generations")
    return errors, notes


def check_recipe_fits(recipe, training_args, raw) -> None:
    """Raise :class:`RecipeDataError` naming every recipe field whose size cannot fit the data; warn for caps
    larger than the data."""
    prompts = training_args.generation_batch_size // training_args.num_generations
    errors, notes = fit_problems(recipe, prompts, data_sizes(recipe, raw))
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=3)
    if errors:
        raise RecipeDataError("The recipe does not fit its data: " + "; ".join(errors) + ".")
