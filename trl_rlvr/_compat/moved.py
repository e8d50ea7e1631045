"""Module paths of trl-rlvr 0.2 that moved in 0.3: they keep importing for one release, with a ``FutureWarning``.

``import trl_rlvr.advantages`` (or ``from trl_rlvr.advantages import group_advantages``) returns a stand-in
module that forwards every attribute to :mod:`trl_rlvr.algorithms.advantages` and warns once, at the import,
pointing at the caller's line (TRL's deprecation style). The stand-ins are made by one import finder that
answers for the names in :data:`MOVED` only, so the package itself holds no module per old path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

#: old module -> where it lives now (removed in 0.4)
MOVED = {
    "trl_rlvr.advantages": "trl_rlvr.algorithms.advantages",
    "trl_rlvr.losses": "trl_rlvr.algorithms.losses",
    "trl_rlvr.shaping": "trl_rlvr.algorithms.shaping",
    "trl_rlvr.metrics": "trl_rlvr.algorithms.metrics",
    "trl_rlvr.selective": "trl_rlvr.sampling.selective",
    "trl_rlvr.seeded_sampling": "trl_rlvr.evaluation.generation",
    "trl_rlvr.passk": "trl_rlvr.evaluation.passk",
    "trl_rlvr.eval_report": "trl_rlvr.evaluation.report",
    "trl_rlvr.eval_callback": "trl_rlvr.evaluation.callback",
    "trl_rlvr.voting": "trl_rlvr.rewards.voting",
    "trl_rlvr.eval_cli": "trl_rlvr.scripts.eval",
    "trl_rlvr.recipe": "trl_rlvr.scripts.train",
    "trl_rlvr.data": "trl_rlvr.scripts.data",
    "trl_rlvr.models": "trl_rlvr.scripts.models",
    "trl_rlvr.cli": "trl_rlvr.scripts.cli",
    "trl_rlvr.compat": "trl_rlvr.config",
    "trl_rlvr.trl_contract": "trl_rlvr._compat.trl_contract",
    "trl_rlvr.vllm_cpu": "trl_rlvr._compat.vllm_cpu",
    "trl_rlvr.quantized": "trl_rlvr._compat.quantized",
}
REMOVED_IN = "0.4"


def _importer_stacklevel() -> int:
    """``stacklevel`` for a warning raised in ``create_module`` that points at the line that imported the old path.

    ``warnings`` skips importlib's bootstrap frames by itself; ``importlib.import_module`` (a plain file) it does
    not, so those are counted here."""
    level, frame = 2, sys._getframe(2)  # frame 1 is create_module
    while frame is not None:
        filename = frame.f_code.co_filename
        if "importlib" in filename and "_bootstrap" in filename:
            pass
        elif "importlib" in filename:
            level += 1
        else:
            break
        frame = frame.f_back
    return level


class _MovedModule(types.ModuleType):
    """A stand-in for an old path: every attribute is the new module's."""

    def __init__(self, name: str, target: types.ModuleType):
        super().__init__(name, target.__doc__)
        self.__dict__["_target"] = target

    def __getattr__(self, attr):
        return getattr(self.__dict__["_target"], attr)

    def __setattr__(self, attr, value):  # monkeypatching the old path patches the module itself
        setattr(self.__dict__["_target"], attr, value)

    def __delattr__(self, attr):
        delattr(self.__dict__["_target"], attr)

    def __dir__(self):
        return dir(self.__dict__["_target"])


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED` and loads each as a :class:`_MovedModule` with a ``FutureWarning``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path is removed in trl-rlvr {REMOVED_IN}. Import from {new}.",
            FutureWarning,
            stacklevel=_importer_stacklevel(),
        )
        return _MovedModule(spec.name, importlib.import_module(new))

    def exec_module(self, module):
        pass


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once); it answers for :data:`MOVED`'s names only."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
