"""Importing any module of trl_rlvr or reward_plugins only imports: no changed environment or sys.path, no
output, no open file, no thread, no exception. And the strings that name a module for a subprocess
(the sandbox worker's ``__main__.py``, the reward zygote's ``python -c`` program) resolve.
"""

import json
import subprocess
import sys
import textwrap

import pytest

PACKAGES = ("trl_rlvr", "reward_plugins")

# What our modules import from other libraries, imported first: their own import-time effects are theirs
# (transformers' TrainingArguments sets TORCHINDUCTOR_CACHE_DIR in os.environ, for one).
DEPENDENCIES = ("torch", "transformers:TrainingArguments", "trl:GRPOConfig", "trl:GRPOTrainer")

# Runs in a fresh interpreter: imports DEPENDENCIES, then every module of PACKAGES (pkgutil.walk_packages),
# one at a time, and records what each import changed besides sys.modules. Its own output goes to the file
# named by argv[1]; the test asserts that the process printed nothing at all.
_PROBE = textwrap.dedent(
    """
    import importlib, json, os, pkgutil, sys, tempfile, threading, traceback

    out_path, dependencies, packages = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
    sink = tempfile.TemporaryFile()  # fds 1 and 2 go here, so that any output is seen (and blamed)
    for fd in (1, 2):
        os.dup2(sink.fileno(), fd)
    for dependency in dependencies:
        module, _, attr = dependency.partition(":")
        getattr(importlib.import_module(module), attr) if attr else importlib.import_module(module)
    ours_from = os.fstat(sink.fileno()).st_size  # what the dependencies printed is theirs

    def state():
        return {"environ": dict(os.environ), "sys.path": list(sys.path), "output bytes": os.fstat(sink.fileno()).st_size,
                "threads": threading.active_count(), "open fds": sorted(os.listdir("/proc/self/fd"))}

    report = {"modules": [], "problems": []}

    def check(name):
        before = state()
        try:
            importlib.import_module(name)
            report["modules"].append(name)
        except BaseException:
            report["problems"].append(f"{name}: import raised {traceback.format_exc(limit=-3)}")
        after = state()
        for what, was in before.items():
            now = after[what]
            if was != now:
                if isinstance(was, dict):
                    was, now = ({k: v for k, v in d.items() if d.get(k) != o.get(k)} for d, o in ((was, now), (now, was)))
                report["problems"].append(f"{name}: import changed {what}: {was!r} -> {now!r}")

    for package in packages:
        check(package)
        root = importlib.import_module(package)
        names = [m.name for m in pkgutil.walk_packages(root.__path__, package + ".", onerror=lambda n: None)]
        for name in names:
            check(name)
    sink.seek(ours_from)
    report["output"] = sink.read().decode(errors="replace")[-2000:]
    with open(out_path, "w") as f:
        json.dump(report, f)
    """
)


def _walk_packages_report(tmp_path) -> dict:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), " ".join(DEPENDENCIES), *PACKAGES], capture_output=True, timeout=600
    )
    assert proc.returncode == 0 and not proc.stdout and not proc.stderr, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(out.read_text())


def test_every_module_imports_without_side_effects(tmp_path):
    report = _walk_packages_report(tmp_path)
    assert not report["problems"], "\n".join(report["problems"])
    assert report["output"] == ""
    # the walk really covers both packages, the sandbox worker and the reward pool included
    for name in ("trl_rlvr.trainer", "reward_plugins.code_sandbox.sandbox.worker", "reward_plugins.boxed_math.pool", "reward_plugins.overlong"):
        assert name in report["modules"]


def _run_without_arguments(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_sandbox_worker_program_resolves(tmp_path):
    """The code dir the pool lays out runs as ``python -I -S -B CODE_DIR``: its ``__main__.py``
    (``launcher.install_sandbox_code``) imports the worker and calls main(), which answers a missing command
    line with its usage (exit 2), not with an ImportError or IndexError."""
    from reward_plugins.code_sandbox.host import launcher

    code_dir = tmp_path / "code"
    code_dir.mkdir()
    launcher.install_sandbox_code(str(code_dir), "worker")
    out = _run_without_arguments([launcher.sandbox_python(), "-I", "-S", "-B", str(code_dir)])
    assert out.returncode == 2 and out.stderr.startswith("usage:"), (out.returncode, out.stderr)


def test_reward_zygote_program_resolves():
    """The zygote's ``python -c`` program finds its module by name and answers a missing command
    line with its usage (exit 2)."""
    from reward_plugins.boxed_math import pool as _pool

    out = _run_without_arguments([sys.executable, "-c", _pool.ZYGOTE_PROGRAM])
    assert out.returncode == 2 and out.stderr.startswith("usage:"), (out.returncode, out.stderr)


def test_pool_functions_must_import_back_by_name():
    """The zygote finds its handler by ``module:qualname``: a function it could not find is refused
    when the pool is made, naming it, not when a worker fails to start."""
    from reward_plugins.boxed_math.math_check import check
    from reward_plugins.boxed_math.pool import DeadlinePool

    assert DeadlinePool(check, 1).handler_spec == f"{check.__module__}:check"

    def local(x):
        return x

    with pytest.raises(ValueError, match="local"):
        DeadlinePool(local, 1)
    with pytest.raises(ValueError, match="lambda"):
        DeadlinePool(check, 1, warmup=lambda: None)
