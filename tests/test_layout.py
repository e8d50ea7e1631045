"""The package's shape: the public face, the 0.2 module paths kept for one release, and the directions of dependence."""

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from trl_rlvr._compat.moved import MOVED

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_rlvr"


def test_public_names_resolve():
    import trl_rlvr

    for name in trl_rlvr.__all__:
        assert getattr(trl_rlvr, name) is not None, name


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_path_warns_at_the_importing_line_and_forwards(old):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    moved = [w for w in caught if issubclass(w.category, FutureWarning) and old in str(w.message)]
    assert len(moved) == 1, [str(w.message) for w in caught]
    assert MOVED[old] in str(moved[0].message)
    assert moved[0].filename == __file__  # the user's line, not importlib's or ours
    new = importlib.import_module(MOVED[old])
    public = [n for n in dir(new) if not n.startswith("__")]
    assert public and all(getattr(module, n) is getattr(new, n) for n in public)


def test_from_import_of_an_old_path_works_in_a_fresh_process():
    code = (
        "import warnings; warnings.simplefilter('error', FutureWarning)\n"
        "try:\n    from trl_rlvr.passk import pass_at_k\nexcept FutureWarning as w:\n    print('warned', w)\n"
        "import warnings; warnings.simplefilter('ignore', FutureWarning)\n"
        "from trl_rlvr.passk import pass_at_k; from trl_rlvr.evaluation.passk import pass_at_k as new\n"
        "print(pass_at_k is new)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "warned trl_rlvr.passk moved to trl_rlvr.evaluation.passk; the old path is removed in trl-rlvr 0.4. "
        "Import from trl_rlvr.evaluation.passk.",
        "True",
    ]


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


@pytest.mark.parametrize(
    "package, never",
    [
        ("trl_rlvr.algorithms", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts", "trl_rlvr.evaluation")),
        ("trl_rlvr.sampling", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts", "trl_rlvr.evaluation")),
        ("trl_rlvr.rewards", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts", "trl_rlvr.evaluation")),
        ("trl_rlvr.evaluation", ("trl_rlvr.trainer", "trl_rlvr.scripts")),
        ("trl_rlvr.audit", ("trl_rlvr.trainer", "trl_rlvr.config", "trl_rlvr.scripts", "trl_rlvr.evaluation")),
    ],
)
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


def test_the_moved_paths_are_documented():
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = [f"`{old}` | `{new}`" for old, new in MOVED.items() if f"`{old}` | `{new}`" not in page]
    assert not missing


def test_patching_an_old_path_patches_the_module():
    """Code that monkeypatches ``trl_rlvr.recipe.build_trainer`` (0.2) must keep patching what the package calls."""
    import trl_rlvr.scripts.train as train

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        old = importlib.import_module("trl_rlvr.recipe")
    original = train.use_cpu_threads
    try:
        old.use_cpu_threads = "patched"
        assert train.use_cpu_threads == "patched"
    finally:
        train.use_cpu_threads = original


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
