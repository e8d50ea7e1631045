"""trl-rlvr test suite: a package, so its shared helpers (launch, harnesses, probes) import as ``tests.<module>``.

Harness scripts that run in subprocesses are started as modules (``python -m tests.<module>``) from the
repository root; the tiny model builders are public in :mod:`trl_rlvr.testing`.
"""
