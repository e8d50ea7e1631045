"""The package's shape: the public face at the top, one home per concept, and the directions of dependence.

The core's rules are below; the reward side (``reward_plugins/``) adds its own rows to :data:`DIRECTIONS` and its
own tests beside them.
"""

import ast
import importlib
import re
import subprocess
import sys
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
    ("trl_rlvr.rollouts", (*_PURE, "trl_rlvr.checks", "trl_rlvr.sampling", "trl_rlvr.rewards", "trl_rlvr.audit")),
    ("trl_rlvr.rewards", (*_PURE, "trl_rlvr.checks", "trl_rlvr.audit")),
    ("trl_rlvr.checks", (*_PURE, "trl_rlvr.presets", "trl_rlvr.sampling", "trl_rlvr.rewards", "trl_rlvr.audit")),
    ("trl_rlvr.audit", (*_PURE, "trl_rlvr.checks")),
    ("trl_rlvr.faults", (*_PURE, "trl_rlvr.checks", "trl_rlvr.sampling", "trl_rlvr.rewards", "trl_rlvr.audit")),
    ("trl_rlvr.evaluation", ("trl_rlvr.trainer", "trl_rlvr.scripts", "trl_rlvr.checks", "trl_rlvr.audit")),
    ("trl_rlvr.presets", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts")),
    ("trl_rlvr.config", ("trl_rlvr.trainer", "trl_rlvr.scripts", "trl_rlvr.evaluation", "trl_rlvr.sampling")),
    ("trl_rlvr.trainer", ("trl_rlvr.scripts", "trl_rlvr.audit")),
    ("trl_rlvr._compat", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts", "trl_rlvr.checks")),
]


#: Modules outside the directions, and why: the audit's reward process (a script, imported by no module) builds the
#: run's trainer so that the reward is called through it.
EXEMPT = {"trl_rlvr.audit._child"}


@pytest.mark.parametrize("package, never", DIRECTIONS, ids=[row[0] for row in DIRECTIONS])
def test_directions_of_dependence(package, never):
    wrong = {
        name: sorted(m for m in deps if m.startswith(never))
        for name, deps in GRAPH.items() if name.startswith(package) and name not in EXEMPT
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
DOCUMENTED_PACKAGES = ("trl_rlvr", "reward_plugins")


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
            if not any(part.isupper() for part in dotted.split(".")):  # NAME: a placeholder, not a path
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


# ---------------------------------------------------------------- the reward side
PLUGINS = ROOT / "reward_plugins"
SANDBOX_SIDE = PLUGINS / "code_sandbox" / "sandbox"
HOST_SIDE = PLUGINS / "code_sandbox" / "host"


def _all_imports(path: Path) -> set[tuple[int, str]]:
    """(level, module) of every import in ``path``, at any depth (level 0: absolute; ``from . import x`` gives
    (1, "x"), ``from ..host import y`` gives (2, "host.y"))."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.update((node.level, f"{base}.{a.name}".strip(".")) for a in node.names)
            if base:
                found.add((node.level, base))
        elif isinstance(node, ast.Import):
            found.update((0, a.name) for a in node.names)
    return found


def test_the_sandbox_side_is_stdlib_only_and_never_reaches_the_host_side():
    """What is laid into the sandbox imports only the standard library and its own folder: never the host side,
    the faces, other plugins, torch or TRL."""
    wrong = {}
    for path in SANDBOX_SIDE.glob("*.py"):
        bad = sorted(
            m for level, m in _all_imports(path)
            if (level == 0 and m.split(".")[0] not in sys.stdlib_module_names) or level > 1
        )
        if bad:
            wrong[path.name] = bad
    assert not wrong


def test_the_sandbox_side_runs_alone_as_laid_into_the_sandbox(tmp_path):
    """Laid into a code dir as a pool does, every module of the sandbox side imports under ``python -I -S`` with
    nothing else of the project reachable."""
    from reward_plugins.code_sandbox.host import launcher

    launcher.install_sandbox_code(str(tmp_path), "worker")
    names = sorted(p.stem for p in SANDBOX_SIDE.glob("*.py") if p.stem != "__init__")
    code = "import importlib, sys\n" + "".join(
        f"importlib.import_module('{launcher.SANDBOX_PACKAGE}.{n}')\n" for n in names
    ) + "print(sorted(m for m in sys.modules if m.startswith('reward_plugins')))"
    (tmp_path / "__main__.py").write_text(code)  # run as the sandbox runs it: the code dir is the program
    out = subprocess.run([sys.executable, "-I", "-S", "-B", str(tmp_path)], capture_output=True, text=True, timeout=60, env={})
    assert out.returncode == 0, out.stderr
    loaded = set(ast.literal_eval(out.stdout.strip()))
    assert {f"{launcher.SANDBOX_PACKAGE}.{n}" for n in names} <= loaded
    assert not {m for m in loaded if not m.startswith(launcher.SANDBOX_PACKAGE)} - {"reward_plugins", "reward_plugins.code_sandbox"}


def test_the_host_side_never_imports_a_face():
    """faces (plugin, environment) -> host -> sandbox: the host side knows nothing of the reward or the tool."""
    wrong = {
        path.name: sorted(m for level, m in _all_imports(path) if level == 2 and m.split(".")[0] in ("plugin", "environment"))
        for path in HOST_SIDE.glob("*.py")
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_no_plugin_imports_the_trainer_or_the_config():
    """A plugin is a plain TRL reward function: it never needs the trainer (algorithms' pure functions are fine)."""
    wrong = {
        str(p.relative_to(ROOT)): sorted(m for level, m in _all_imports(p) if level == 0 and m.startswith(("trl_rlvr.trainer", "trl_rlvr.config", "trl.trainer")))
        for p in PLUGINS.rglob("*.py")
    }
    assert not {k: v for k, v in wrong.items() if v}


def _module_aliases(path: Path) -> dict[str, Path]:
    """Local name -> file, for every module of ``reward_plugins`` that ``path`` imports as a module."""
    aliases = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            if node.level == 0:
                base = ROOT
            for part in (node.module or "").split(".") if node.module else ():
                base = base / part
            for a in node.names:
                target = base / f"{a.name}.py"
                if target.is_file() and PLUGINS in target.parents:
                    aliases[a.asname or a.name] = target
        elif isinstance(node, ast.Import):
            for a in node.names:
                target = ROOT.joinpath(*a.name.split(".")).with_suffix(".py")
                if a.asname and target.is_file() and PLUGINS in target.parents:
                    aliases[a.asname] = target
    return aliases


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_plugin_module_reaches_another_modules_private_names():
    """A name with a leading underscore is its module's own: no other module of ``reward_plugins`` imports it
    (``from .boxes import _scan_group``) or reaches it through the module (``protocol._write_all``)."""
    wrong = {}
    for path in PLUGINS.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(path)
        bad = [
            f"from {'.' * node.level}{node.module or ''} import {a.name}"
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.level > 0 or (node.module or "").startswith("reward_plugins"))
            for a in node.names if _private(a.name)
        ] + [
            f"{node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
            and aliases[node.value.id] != path and _private(node.attr)
        ]  # fmt: skip
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(set(bad))
    assert not wrong
