"""``trl-rlvr train --help`` and ``trl-rlvr doctor --help``: what the command does and its own options, in well under a
second; ``--help-all`` prints every field of the three dataclasses (TRL's parser, which imports TRL and torch).

A recipe takes ~230 fields (:class:`~trl_rlvr.scripts.train.RecipeArguments`, ``RLVRConfig`` = TRL's ``GRPOConfig``
= transformers' ``TrainingArguments`` plus the RLVR switches, ``trl.ModelConfig``). The short help shows the recipe's
own fields in full, then the RLVR switches and the most-used TRL/transformers fields with the first sentence of
their help. Those two groups are read from :mod:`trl_rlvr.scripts.field_help`, generated from the dataclasses' own
help texts by ``python -m trl_rlvr.scripts.options_doc`` (a test checks it is current), so that printing them
imports neither TRL nor torch.
"""

from __future__ import annotations

import dataclasses
import os
import textwrap

HELP_ALL = "--help-all"


def wants_help(argv: list[str]) -> str | None:
    """``"short"`` for ``-h``/``--help``, ``"all"`` for ``--help-all``, else None."""
    if HELP_ALL in argv:
        return "all"
    if "-h" in argv or "--help" in argv:
        return "short"
    return None


def _width() -> int:
    try:
        columns = os.get_terminal_size().columns
    except OSError:
        columns = 100
    return max(60, min(columns, 120))


def _entry(name: str, default: str, help_text: str, width: int) -> list[str]:
    """``--name (default: D): help``, wrapped under the name."""
    return textwrap.wrap(f"--{name} (default: {default}): {' '.join(help_text.split())}", width=width,
                         initial_indent="  ", subsequent_indent=" " * 6, break_on_hyphens=False)


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "required"


def own_fields(cls, below: type | None = None) -> list[tuple[str, str, str]]:
    """(name, default, help) of ``cls``'s dataclass fields; with ``below``, only those ``below`` does not have."""
    skip = {f.name for f in dataclasses.fields(below)} if below is not None else set()
    return [(f.name, _default_text(f), f.metadata.get("help", "")) for f in dataclasses.fields(cls) if f.name not in skip]


def short_help(prog: str, usage: str, description: str, sections: list[tuple[str, list[tuple[str, str, str]]]]) -> str:
    """The short help: usage, what the command does, then ``sections`` of (title, [(name, default, help)]), then the
    RLVR switches and the most-used TRL/transformers fields (:mod:`trl_rlvr.scripts.field_help`)."""
    from trl_rlvr.scripts.field_help import COMMON_FIELDS, RLVR_SWITCHES

    width = _width()
    lines = [f"usage: {prog} {usage}", ""]
    lines += textwrap.wrap(" ".join(description.split()), width=width)
    for title, entries in sections:
        lines += ["", f"{title}:"]
        for entry in entries:
            lines += _entry(*entry, width)
    lines += ["", "RLVR switches (RLVRConfig's own fields; in full: docs/trainer.md):"]
    for title, entries in RLVR_SWITCHES.items():
        lines += [f" {title}:"]
        for entry in entries:
            lines += _entry(*entry, width)
    for title, entries in COMMON_FIELDS.items():
        lines += ["", f"{title}:"]
        for entry in entries:
            lines += _entry(*entry, width)
    lines += ["", *textwrap.wrap(
        f"Every other field of TRL's GRPOConfig, transformers' TrainingArguments and trl.ModelConfig, each with its "
        f"full help: {prog} {HELP_ALL}. A field is set in the recipe's YAML (`field: value`) or on the command line "
        f"(`--field value`, which wins).", width=width)]
    return "\n".join(lines) + "\n"
