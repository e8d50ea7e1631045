"""Reward plugin registry: entry points in the group ``trl_rlvr.rewards`` -> TRL reward functions.

A plugin is an installed package that declares, in its ``pyproject.toml``::

    [project.entry-points."trl_rlvr.rewards"]
    my_reward = "my_package.module:my_factory"

where ``my_factory(**options)`` returns a plain TRL reward function
``f(prompts, completions, **kwargs) -> list[float | None]`` (picklable, with a ``__name__``; the contract and its
optional attributes: :mod:`trl_rlvr.rewards.contract`). The built-in plugins (``boxed_math``, ``think_format``,
``overlong``, ``code_sandbox``, TRL's own rewards) are in :data:`BUILTIN_REWARDS`, imported directly, so they resolve
from a plain clone too.

This module is light on purpose (standard library only; plugins are imported when first used), and a
plugin that fails to import breaks only itself: its error names its package.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from trl_rlvr.rewards.contract import RewardContractError, check_reward_function

GROUP = "trl_rlvr.rewards"

#: The plugins this project ships, imported directly (entry points are for third-party packages). An installed
#: entry point with one of these names does not replace the built-in: it is skipped with a warning.
BUILTIN_REWARDS = {
    "boxed_math": "reward_plugins.boxed_math:boxed_math",
    "code_sandbox": "reward_plugins.code_sandbox:code_sandbox",
    "overlong": "trl_rlvr.algorithms.shaping:overlong_penalty",  # the core's own (reward_plugins.overlong: its face)
    "think_format": "reward_plugins.think_format:think_format",
    # TRL's own reward functions (trl.rewards), under the names TRL logs them by
    **{
        name: f"reward_plugins.trl_rewards:{name}"
        for name in ("accuracy_reward", "cosine_scaled_reward", "reasoning_accuracy_reward",
                     "repetition_penalty_reward", "soft_overlong_punishment_reward", "think_format_reward")
    },
}

__all__ = [
    "GROUP",
    "RewardPluginError",
    "RewardSpec",
    "available_rewards",
    "describe_reward",
    "load_reward",
    "resolve_reward_funcs",
    "resolve_reward_spec",
]


class RewardPluginError(ImportError):
    """A registered reward plugin could not be imported (its package is named in the message)."""


@dataclass(frozen=True)
class RewardSpec:
    """One registered reward: its name, entry point target (``module:factory``) and providing package."""

    name: str
    value: str
    package: str
    version: str

    @property
    def module(self) -> str:
        return self.value.partition(":")[0]


def _version() -> str:
    """This distribution's version, from its installed metadata (not the package root, which imports everything)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl-rlvr")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "unknown"


def _entry_points() -> dict[str, tuple[RewardSpec, EntryPoint]]:
    __version__ = _version()
    found = {
        name: (RewardSpec(name, value, "trl-rlvr", __version__), EntryPoint(name, value, GROUP))
        for name, value in BUILTIN_REWARDS.items()
    }
    for ep in entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        package = getattr(dist, "name", None) or "?"
        if ep.name in BUILTIN_REWARDS:
            if ep.value != BUILTIN_REWARDS[ep.name]:
                _warn_shadowing(ep.name, ep.value, package)
            continue
        spec = RewardSpec(ep.name, ep.value, package, getattr(dist, "version", None) or "?")
        found.setdefault(ep.name, (spec, ep))  # first on sys.path wins (as for imports)
    return dict(sorted(found.items()))


@functools.lru_cache(maxsize=None)
def _warn_shadowing(name: str, value: str, package: str) -> None:
    logging.getLogger(__name__).warning(
        "Reward plugin %r of package %r (%s) has the name of a built-in reward and is ignored; rename it.",
        name, package, value,
    )


def reward_specs() -> dict[str, RewardSpec]:
    """Every registered reward name -> its :class:`RewardSpec` (nothing is imported)."""
    return {name: spec for name, (spec, _) in _entry_points().items()}


def _unknown(name: str, names: Iterable[str]) -> ValueError:
    names = sorted(names)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(
        f"Unknown reward {name!r}.{hint} Available rewards: {', '.join(names) or '(none installed)'}. "
        f"Install a package that declares an entry point in the group {GROUP!r} to add one."
    )


def _load_factory(name: str) -> tuple[Callable[..., Any], RewardSpec]:
    eps = _entry_points()
    if name not in eps:
        raise _unknown(name, eps)
    spec, ep = eps[name]
    try:
        factory = ep.load()
    except Exception as e:  # noqa: BLE001 - any import-time failure of a plugin
        raise RewardPluginError(
            f"Reward plugin {name!r} (entry point {spec.value!r} of package {spec.package!r} {spec.version}) "
            f"failed to import: {type(e).__name__}: {e}"
        ) from e
    if not callable(factory):
        raise RewardPluginError(f"Reward plugin {name!r} of package {spec.package!r}: {spec.value!r} is not callable")
    return factory, spec


def _first_line(doc: str | None) -> str:
    doc = inspect.cleandoc(doc or "")
    return doc.splitlines()[0].strip() if doc else ""


def available_rewards() -> dict[str, str]:
    """Registered reward name -> one-line description (the first line of its factory's docstring).

    A plugin that fails to import is still listed, with the error as its description.
    """
    out = {}
    for name in reward_specs():
        try:
            factory, _ = _load_factory(name)
            out[name] = _first_line(factory.__doc__) or "(no description)"
        except RewardPluginError as e:
            out[name] = f"[unavailable] {e}"
    return out


def _options(factory: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}, True
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {
        n: p for n, p in params.items() if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    return named, accepts_any


def describe_reward(name: str) -> dict[str, Any]:
    """What ``trl-rlvr rewards show NAME`` prints: package, target, description, docstring and options."""
    factory, spec = _load_factory(name)
    named, accepts_any = _options(factory)
    options = {
        n: {
            "default": None if p.default is inspect.Parameter.empty else p.default,
            "required": p.default is inspect.Parameter.empty,
            "annotation": "" if p.annotation is inspect.Parameter.empty else str(p.annotation),
        }
        for n, p in named.items()
    }
    return {
        "name": name,
        "package": spec.package,
        "version": spec.version,
        "entry_point": spec.value,
        "description": _first_line(factory.__doc__),
        "doc": inspect.cleandoc(factory.__doc__ or ""),
        "options": options,
        "accepts_any_option": accepts_any,
    }


def load_reward(name: str, **options: Any) -> Callable[..., list[float | None]]:
    """Build the reward function registered as ``name`` with ``options`` (its factory's keyword arguments).

    Raises ``ValueError`` for an unknown name (listing the available names and the closest match) or an
    unknown option (naming the plugin and the option), :class:`RewardPluginError` when the plugin's
    package fails to import.
    """
    factory, spec = _load_factory(name)
    named, accepts_any = _options(factory)
    if not accepts_any:
        unknown = [o for o in options if o not in named]
        if unknown:
            close = {o: difflib.get_close_matches(o, named, n=1) for o in unknown}
            hints = "; ".join(f"{o!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for o, c in close.items())
            raise ValueError(
                f"Reward {name!r} (package {spec.package!r}) has no option {hints}. "
                f"Its options: {', '.join(named) or '(none)'}"
            )
        missing = [n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in options]
        if missing:
            raise ValueError(f"Reward {name!r} (package {spec.package!r}) needs the option(s) {', '.join(missing)}")
    reward = factory(**options)
    if not callable(reward):
        raise RewardContractError(
            f"Reward plugin {name!r} ({spec.value}) returned {type(reward).__name__}, not a callable"
        )
    if getattr(reward, "__name__", None) != name:
        # TRL logs rewards/<__name__>/mean, and success_reward names a reward by __name__: both must be the name
        # the user wrote in reward_funcs.
        try:
            reward.__name__ = name
        except (AttributeError, TypeError) as e:
            raise TypeError(
                f"Reward plugin {name!r} ({spec.value}) returned a {type(reward).__name__} whose __name__ cannot be "
                f"set to {name!r}, the name TRL logs it by"
            ) from e
    check_reward_function(reward, name)
    return reward


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable at import path ``spec``, ``module:name`` or ``module.name``; ``what`` names the setting in errors
    (``"reward"``, ``"environment_factory"``).

    Raises ``ValueError`` naming ``what`` and ``spec`` when it is not such a path, does not import, or is not
    callable."""
    import importlib

    module, sep, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not sep or not module or not attr:
        raise ValueError(f"{what} {spec!r} is not a module.name (or module:name) import path")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{what} {spec!r}: cannot import {attr!r} from {module!r}: {e}") from e
    if not callable(obj):
        raise ValueError(f"{what} {spec!r} is not callable")
    return obj


def import_reward_function(spec: str) -> Callable[..., Any]:
    """A reward function given by its import path, ``module:function`` or ``module.function``.

    Raises ``ValueError`` naming ``spec`` when it is not such a path, does not import, or is not callable."""
    fn = import_callable(spec, "reward")
    check_reward_function(fn, spec)
    return fn


def resolve_reward_spec(spec: Any, options: Mapping[str, Any] | None = None) -> Any:
    """The one resolver for a reward named in a config, a recipe or on the command line.

    - a registered name: ``load_reward(spec, **options)``;
    - a hub id or local path of a reward model (``owner/name``, an existing path): returned as is, for TRL to load;
    - ``module:function`` or ``module.function``: that function (:func:`import_reward_function`);
    - anything that is not a string (a callable, an ``nn.Module``): returned as is.

    Options for anything but a registered name are an error naming it; so is a bare word that is not registered
    (naming the closest registered reward).
    """
    if not isinstance(spec, str):
        return spec
    if spec in reward_specs():
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reward_options[{spec!r}] must be a mapping of option -> value, got {type(options).__name__}")
        return load_reward(spec, **(options or {}))
    if options:
        raise ValueError(f"reward options given for {spec!r}: options apply to registered reward names only")
    if "/" in spec or os.path.exists(spec):
        return spec  # a reward model: TRL loads it
    if ":" in spec or "." in spec:
        return import_reward_function(spec)
    raise _unknown(spec, reward_specs())


def resolve_reward_funcs(reward_funcs: Any, reward_options: Mapping[str, Mapping[str, Any]] | None = None) -> list:
    """Each entry of ``reward_funcs`` through :func:`resolve_reward_spec`, for ``GRPOTrainer(reward_funcs=...)``.

    ``reward_options`` maps a registered name to its options. A single entry is accepted too. Options for a name
    that is not among ``reward_funcs`` are an error (most likely a typo).
    """
    if reward_funcs is None:
        return []
    if isinstance(reward_funcs, (str, bytes)) or not isinstance(reward_funcs, Iterable):
        reward_funcs = [reward_funcs]
    reward_funcs = list(reward_funcs)
    reward_options = dict(reward_options or {})
    names = set(reward_specs()) if any(isinstance(f, str) for f in reward_funcs) or reward_options else set()
    used = {f for f in reward_funcs if isinstance(f, str) and f in names}
    stray = [k for k in reward_options if k not in used]
    if stray:
        raise ValueError(
            f"reward_options given for {stray}, which {'is' if len(stray) == 1 else 'are'} not a registered "
            f"reward name in reward_funcs ({sorted(used) or 'none'})"
        )
    return [resolve_reward_spec(f, reward_options.get(f) if isinstance(f, str) else None) for f in reward_funcs]
