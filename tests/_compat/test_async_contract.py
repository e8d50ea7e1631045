"""The upgrade drill for the asynchronous trainer: the installed ``trl.experimental.async_grpo`` still has the shape
trl_rlvr/_compat/async_adapter.py and trl_rlvr/async_grpo/async_trainer.py rely on (trl_contract.ASYNC_ADAPTER),
every private TRL name they use is declared there, and a TRL that moved is named, adapter piece first."""

import ast
import functools
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

from trl_rlvr._compat import trl_contract
from trl_rlvr._compat.trl_contract import ASYNC_ADAPTER, async_contract_violations

pytestmark = pytest.mark.trl_contract  # the TRL-upgrade check: `pytest -m trl_contract`

ROOT = Path(__file__).resolve().parents[2]
ASYNC_MODULES = (ROOT / "trl_rlvr" / "_compat" / "async_adapter.py", ROOT / "trl_rlvr" / "async_grpo" / "async_trainer.py")
PACKAGE = "trl.experimental.async_grpo"


def test_installed_trl_keeps_the_async_contract():
    problems = async_contract_violations()
    assert not problems, "TRL's asynchronous trainer changed under trl-rlvr:\n" + "\n".join(problems)


# -- every private TRL name used is declared -----------------------------------------------------------------------

def declared_names() -> set[str]:
    """Every name ASYNC_ADAPTER declares: its owners' modules and classes, the methods, classes and names of
    ``signatures``, ``uses`` (text keys excepted) and ``stands_in_for``."""
    names = set()
    for touch in ASYNC_ADAPTER.values():
        dotted = [touch.owner, *touch.signatures, *touch.uses, touch.stands_in_for]
        names |= {part for name in dotted if re.fullmatch(r"[A-Za-z_][\w.]*", name) for part in name.split(".")}
    return names


def _trl_has(base: type, name: str) -> bool:
    """Whether TRL's class ``base`` (or a class it inherits) has ``name``: a class attribute or method, or an instance
    attribute its source sets or reads (``self.<name>``)."""
    if hasattr(base, name):
        return True
    return any(re.search(rf"\bself\.{name}\b", _class_source(cls)) for cls in base.__mro__
               if cls.__module__.startswith("trl."))


@functools.cache
def _class_source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


class _Scan(ast.NodeVisitor):
    """What of TRL's a module uses (:func:`used_trl_names`)."""

    def __init__(self):
        self.imported: dict[str, object] = {}  # local name -> TRL object imported from trl.experimental.async_grpo
        self.used: set[str] = set()
        self.ours: set[str] = set()
        self.class_stack: list[type | None] = []  # the TRL base of each enclosing class (None: not TRL's)
        self.members: set[int] = set()  # the class bodies' statements (their names are sorted in visit_ClassDef)

    def visit_ImportFrom(self, node):
        if (node.module or "").startswith(PACKAGE):
            module = importlib.import_module(node.module)
            public = set(getattr(importlib.import_module(PACKAGE), "__all__", ())) | {"AsyncGRPOConfig",
                                                                                     "AsyncGRPOTrainer"}
            for alias in node.names:
                self.imported[alias.asname or alias.name] = getattr(module, alias.name)
                if not (node.module == PACKAGE and alias.name in public):
                    self.used.add(alias.name)

    def visit_ClassDef(self, node):
        bases = [self.imported[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in self.imported]
        base = next((b for b in bases if isinstance(b, type)), None)
        self.ours.add(node.name)
        self.members.update(id(item) for item in node.body)
        for item in node.body:  # a name the class body defines: an override when TRL's class has it
            for name in _defined_names(item):
                if base is not None and not _is_dunder(name) and _trl_has(base, name):
                    self.used.add(name)
                else:
                    self.ours.add(name)
        self.class_stack.append(base)
        self.generic_visit(node)
        self.class_stack.pop()

    def visit_FunctionDef(self, node):
        if id(node) not in self.members:  # a module function, or one nested in a method
            self.ours.add(node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node):
        self._note(node.value, node.attr, isinstance(node.ctx, ast.Store))
        self.generic_visit(node)

    def visit_Call(self, node):  # getattr(x, "_name", ...), setattr, hasattr: an attribute too
        if (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            self._note(node.args[0], node.args[1].value, node.func.id == "setattr")
        self.generic_visit(node)

    def _note(self, value, attr: str, store: bool) -> None:
        receiver = value.id if isinstance(value, ast.Name) else None
        base = self.class_stack[-1] if self.class_stack else None
        if receiver in self.imported and inspect.ismodule(self.imported[receiver]):
            self.used.add(attr)  # a name of an imported TRL module
        elif attr.startswith("_") and not _is_dunder(attr):
            if receiver == "self" and self.class_stack:
                if base is not None and _trl_has(base, attr):
                    self.used.add(attr)
                elif store:
                    self.ours.add(attr)
            else:
                self.used.add(attr)


def _defined_names(item) -> list[str]:
    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [item.name]
    targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def used_trl_names(*sources: str, own_classes: tuple[type, ...] = ()) -> set[str]:
    """The names of TRL's (and of transformers' objects TRL builds) that ``sources`` use: names imported from
    trl.experimental.async_grpo's modules (its public exports excepted) and those read on an imported TRL module;
    methods and attributes that a subclass of a TRL class overrides, or reads on ``self``, when TRL's class has them;
    private attributes (``x._name``) read or set on any other object, unless our own code defines them (the scanned
    modules' functions, classes and attributes, and ``own_classes``' members, e.g. a NamedTuple's ``_replace``)."""
    scans = []
    for source in sources:
        scan = _Scan()
        scan.visit(ast.parse(source))
        scans.append(scan)
    ours = set().union(*(scan.ours for scan in scans)) | {n for cls in own_classes for n in dir(cls)}
    used = set().union(*(scan.used for scan in scans))
    return used - ours


def _own_classes() -> tuple[type, ...]:
    """The classes of the scanned modules that subclass nothing of TRL's."""
    from trl_rlvr._compat import async_adapter
    from trl_rlvr.async_grpo import async_trainer

    return tuple(obj for module in (async_adapter, async_trainer) for obj in vars(module).values()
                 if isinstance(obj, type) and obj.__module__ == module.__name__
                 and not any(base.__module__.startswith("trl.") for base in obj.__mro__[1:]))


def test_every_private_trl_name_the_async_modules_use_is_declared():
    """A private TRL name that async_adapter.py or async_trainer.py uses without an ASYNC_ADAPTER entry fails here."""
    used = used_trl_names(*(path.read_text() for path in ASYNC_MODULES), own_classes=_own_classes())
    assert used, "the scan found nothing: it no longer reads the modules"
    undeclared = sorted(used - declared_names())
    assert not undeclared, f"TRL names the asynchronous modules use without an ASYNC_ADAPTER entry: {undeclared}"


def test_the_scan_sees_each_kind_of_undeclared_use():
    """The check above can fail: a private import, an override, a private attribute read on self or on a trainer, a
    name read on an imported TRL module, each undeclared, are found; our own names and TRL's exports are not."""
    source = '''
from trl.experimental.async_grpo import AsyncGRPOTrainer
from trl.experimental.async_grpo import async_grpo_trainer as trainer_module
from trl.experimental.async_grpo.async_grpo_trainer import round_lora_rank


class Ours(AsyncGRPOTrainer):
    def _streaming_iter(self):
        self._ours_only = 1
        return self._trained_groups, self._ours_only


class Helper:
    def __init__(self):
        self._lock = None


def sync(trainer):
    trainer._sync_weight()
    getattr(trainer, "_last_groups_trained", None)
    return trainer_module.validate_lora_for_vllm_sync
'''
    assert used_trl_names(source) - declared_names() == {"round_lora_rank", "_streaming_iter", "_trained_groups",
                                                         "_sync_weight", "_last_groups_trained",
                                                         "validate_lora_for_vllm_sync"}


# -- a TRL that moved is named, piece first ------------------------------------------------------------------------

def test_every_piece_of_the_table_is_in_the_async_modules():
    """Each key of ASYNC_ADAPTER names a function, class, method or attribute of async_adapter.py or async_trainer.py
    (the table says which piece to change), and each override the table declares is one of ours."""
    for piece in ASYNC_ADAPTER:
        assert trl_contract._async_piece(piece) is not None, f"{piece} is not in trl_rlvr"


def _rewritten(self, *args, **kwargs):
    return None


def _without(obj, attr: str, value=None):
    """A stand-in of TRL's class or module ``obj`` whose ``attr`` is ``value`` (None: gone)."""
    if inspect.ismodule(obj):
        return types.SimpleNamespace(**{**vars(obj), attr: value})
    return type(f"Changed{obj.__name__}", (obj,), {attr: value})


def _break_first(touch) -> dict:
    """``replaced`` for async_contract_violations: a TRL without the first thing ``touch`` relies on (a method it
    overrides or calls, the function it stands in for, the method that must use a name rewritten, or the name)."""
    from trl_rlvr._compat.trl_contract import _async_object, _holder

    if touch.signatures:
        path, attr = _holder(touch.owner, next(iter(touch.signatures)))
        return {path: _without(_async_object(path, {}), attr)}
    if touch.stands_in_for:
        return {touch.owner: _without(_async_object(touch.owner, {}), touch.stands_in_for)}
    name, methods = next(iter(touch.uses.items()))
    path, attr = _holder(touch.owner, methods[0] if methods else name)
    return {path: _without(_async_object(path, {}), attr, _rewritten if methods else None)}


@pytest.mark.parametrize("piece", sorted(ASYNC_ADAPTER))
def test_every_piece_is_named_when_what_it_relies_on_moves(piece):
    """The drill for each piece: remove what it relies on from a stand-in TRL and the check names that piece."""
    problems = async_contract_violations(_break_first(ASYNC_ADAPTER[piece]))
    assert any(p.startswith(f"change {piece}: ") for p in problems), problems


def test_a_changed_async_trl_is_named_clearly():
    """A rollout loop whose overridden method changed signature and whose metrics push is gone, a worker without its
    loop class, a stand-in that no longer takes what TRL's weight sync takes: each reported, piece first."""
    from trl.experimental.async_grpo import async_grpo_trainer
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

    class MovedLoop(_AsyncRolloutLoop):
        async def _score_group(self, groups):  # renamed parameter
            return []

    MovedLoop._push_metrics = None  # gone

    class MovedClient(async_grpo_trainer.WeightTransferClient):
        def __init__(self, vllm_client, weight_update_info, weight_sync_timeout=1800, *, backend="nccl"):
            pass

    module = types.SimpleNamespace(**{**vars(async_grpo_trainer), "WeightTransferClient": MovedClient})
    problems = async_contract_violations({"async_rollout_worker._AsyncRolloutLoop": MovedLoop,
                                          "async_rollout_worker.AsyncRolloutWorker": _without(AsyncRolloutWorker,
                                                                                              "_loop_cls"),
                                          "async_grpo_trainer": module})
    text = "\n".join(problems)
    assert ("change async_adapter.RLVRRolloutLoop._score_group: async_rollout_worker._AsyncRolloutLoop._score_group"
            "('groups',) lacks parameter(s) ['group']") in text
    assert "change async_adapter.RLVRRolloutLoop._score_group: async_rollout_worker._AsyncRolloutLoop._push_metrics is gone" in text
    assert "change async_adapter.set_stream_start: async_rollout_worker.AsyncRolloutWorker._loop_cls is gone" in text
    assert "change async_adapter.FileWeightTransfer: async_grpo_trainer.WeightTransferClient now takes ['backend']" in text
    assert "tested with trl>=1.16,<1.17" in text
    assert all(p.startswith("change async_") for p in problems), problems
