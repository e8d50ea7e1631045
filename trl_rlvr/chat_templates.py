"""A run's chat template by name: a ``.jinja`` file, or one of the templates TRL ships (``trl/chat_templates``).

A tokenizer whose own template cannot render tools (SmolLM2's) cannot run TRL's tool loop; a recipe's
``chat_template`` (``trl-rlvr train`` / ``doctor``) or ``trl-rlvr eval --chat_template`` gives it one:

- a path to a file holding the template (Jinja), or
- the name of a template TRL ships, e.g. ``qwen2_5`` (ChatML with tools, ``<tool_call>`` JSON; TRL knows its
  response template, so tool calls parse), listed by :func:`trl_template_names`.

:func:`check_renders_tools` runs TRL's own test (``supports_tool_calling``) on the tokenizer alone, so a run with
an ``environment_factory`` stops before the model loads.
"""

from __future__ import annotations

from pathlib import Path


def trl_templates_dir() -> Path:
    import trl

    return Path(trl.__file__).parent / "chat_templates"


def trl_template_names() -> list[str]:
    """The names of the chat templates TRL ships (file stems of ``trl/chat_templates/*.jinja``)."""
    return sorted(p.stem for p in trl_templates_dir().glob("*.jinja"))


def resolve_chat_template(spec: str, field: str = "chat_template") -> str:
    """The template text ``spec`` names: a file's content, or the TRL template of that name. ``ValueError``
    naming ``field`` otherwise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{field} must name a template file or one of TRL's templates, not {spec!r}")
    path = Path(spec).expanduser()
    if path.is_file():
        text = path.read_text()
        if not text.strip():
            raise ValueError(f"{field} {spec!r}: the file is empty")
        return text
    bundled = trl_templates_dir() / f"{spec}.jinja"
    if "/" not in spec and bundled.is_file():
        return bundled.read_text()
    names = trl_template_names()
    import difflib

    close = difflib.get_close_matches(spec, names, n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise ValueError(f"{field} {spec!r}: no such file, nor a chat template TRL ships.{hint} TRL's templates: "
                     f"{', '.join(names)}")


def apply_chat_template_spec(tokenizer, spec: str | None, field: str = "chat_template"):
    """``tokenizer`` with the template ``spec`` names as its chat template (``None``: unchanged)."""
    if spec is not None:
        tokenizer.chat_template = resolve_chat_template(spec, field)
    return tokenizer


def check_renders_tools(tokenizer, where: str) -> None:
    """``ValueError`` unless ``tokenizer``'s chat template renders a whole tool-calling conversation (TRL's
    ``supports_tool_calling``: the call's name and arguments and the tool's reply all appear)."""
    from trl.chat_template_utils import supports_tool_calling

    if not supports_tool_calling(tokenizer):
        raise ValueError(
            f"{where}: the chat template does not render tool calls and tool replies, so TRL's tool loop cannot "
            "run with it. Set chat_template to a template that does: a .jinja file, or one TRL ships, e.g. "
            "'qwen2_5' (ChatML with <tool_call> JSON; docs/python_tool.md)"
        )
