"""The package's shape: the public face at the top, one home per concept, and the directions of dependence.

The core's rules are below; the reward side (``reward_plugins/``) adds its own rows to :data:`DIRECTIONS` and its
own tests beside them.
"""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_rlvr"


def test_public_names_resolve():
    import trl_rlvr

    for name in trl_rlvr.__all__:
        assert getattr(trl_rlvr, name) is not None, name


def test_the_top_level_holds_the_public_faces_and_subpackages():
    """A newcomer reads the product from the top: config, trainer, presets; everything else is in a subpackage."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "config.py", "presets.py", "trainer.py"]


def test_no_two_modules_share_a_name_across_subpackages():
    """One name, one thing: two ``cli.py`` or ``report.py`` (or ``verdict.py`` and ``verdicts.py``) in two
    subpackages make a reader ask which. Package ``__init__`` files and ``trl_rlvr/scripts/`` (one module per
    command, named for what it runs) excepted."""
    seen = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py" or path.parent == PACKAGE / "scripts":
            continue
        seen.setdefault(path.stem.removesuffix("s"), []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_module_is_named_like_a_data_folder_beside_it():
    clashes = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if p.with_suffix("").is_dir()]
    assert clashes == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every trl_rlvr module ``path`` imports, at any depth of the file (lazy imports in functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: {m for m in _imports(p) if m in MODULES and m != name} for name, p in MODULES.items()}


def test_no_relative_imports():
    relative = [
        name for name, p in MODULES.items()
        for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not relative


def test_no_import_circle_between_modules():
    """No module reaches itself through the modules it imports (package ``__init__`` re-exports excluded)."""
    graph = {n: {m for m in deps if not MODULES[m].name == "__init__.py"} for n, deps in GRAPH.items()}

    def reaches(start):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m == start:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return False

    assert [n for n in graph if reaches(n)] == []


_PURE = ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts", "trl_rlvr.evaluation")

#: (modules starting with this, never import modules starting with any of these). Directions of dependence:
#: scripts -> trainer -> config -> checks / algorithms; trainer -> sampling, rewards (registry) -> plugins;
#: evaluation -> rewards; scripts -> audit -> rewards.
DIRECTIONS = [
    ("trl_rlvr.algorithms", (*_PURE, "trl_rlvr.checks", "trl_rlvr.sampling", "trl_rlvr.rewards", "trl_rlvr.audit")),
    ("trl_rlvr.sampling", (*_PURE, "trl_rlvr.checks", "trl_rlvr.audit")),
    ("trl_rlvr.rewards", (*_PURE, "trl_rlvr.checks", "trl_rlvr.audit")),
    ("trl_rlvr.checks", (*_PURE, "trl_rlvr.presets", "trl_rlvr.sampling", "trl_rlvr.rewards", "trl_rlvr.audit")),
    ("trl_rlvr.audit", (*_PURE, "trl_rlvr.checks")),
    ("trl_rlvr.evaluation", ("trl_rlvr.trainer", "trl_rlvr.scripts", "trl_rlvr.checks", "trl_rlvr.audit")),
    ("trl_rlvr.presets", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts")),
    ("trl_rlvr.config", ("trl_rlvr.trainer", "trl_rlvr.scripts", "trl_rlvr.evaluation", "trl_rlvr.sampling")),
    ("trl_rlvr.trainer", ("trl_rlvr.scripts", "trl_rlvr.audit")),
    ("trl_rlvr._compat", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts", "trl_rlvr.checks")),
]


@pytest.mark.parametrize("package, never", DIRECTIONS, ids=[row[0] for row in DIRECTIONS])
def test_directions_of_dependence(package, never):
    wrong = {
        name: sorted(m for m in deps if m.startswith(never))
        for name, deps in GRAPH.items() if name.startswith(package)
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_algorithms_never_import_a_trainer_class():
    for name, p in MODULES.items():
        if name.startswith("trl_rlvr.algorithms"):
            assert not {m for m in _imports(p) if m.startswith(("trl.trainer", "trl.GRPOTrainer", "transformers.Trainer"))}


def test_private_compat_is_not_imported_from_outside_the_package():
    outside = [*ROOT.joinpath("reward_plugins").rglob("*.py"), *ROOT.joinpath("examples").rglob("*.py")]
    users = [str(p.relative_to(ROOT)) for p in outside if any(m.startswith("trl_rlvr._compat") for m in _imports(p))]
    assert users == []


#: Packages whose documented paths are held here (the reward side adds ``reward_plugins``).
DOCUMENTED_PACKAGES = ("trl_rlvr",)


def _documented_paths() -> dict[str, set[str]]:
    """Every ``from P... import a, b`` and every dotted ``P.x.y`` the README, docs/ and examples/ name -> the files."""
    pages = [ROOT / "README.md", *ROOT.joinpath("docs").rglob("*.md"), *ROOT.joinpath("examples").rglob("*.md"),
             *ROOT.joinpath("examples").rglob("*.py")]
    names = "|".join(DOCUMENTED_PACKAGES)
    found: dict[str, set[str]] = {}
    for page in pages:
        text = page.read_text()
        where = str(page.relative_to(ROOT))
        for module, attrs in re.findall(rf"from ((?:{names})[\w.]*) import ([\w, ]+)", text):
            for attr in filter(None, (a.strip().split(" as ")[0] for a in attrs.split(","))):
                found.setdefault(f"{module}.{attr}", set()).add(where)
        for dotted in re.findall(rf"\b(?:{names})(?:\.[A-Za-z_]\w*)+", text):
            found.setdefault(dotted, set()).add(where)
    return found


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_documented_path_imports():
    """What the README, the docs and the examples tell a user to import (or name as a module) exists there."""
    found = _documented_paths()
    assert "trl_rlvr.scripts.train.RecipeArguments" in found  # the scan sees the docs
    broken = {path: sorted(pages) for path, pages in found.items() if not _resolves(path)}
    assert broken == {}
