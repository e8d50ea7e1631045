"""``code_sandbox``: run model-written code against tests in a sandbox, as a TRL reward function.

Split by where the code runs. The faces: ``plugin`` (the reward function), ``environment`` (``PythonEnvironment``,
the sandboxed Python tool for TRL's ``environment_factory``), with ``routing`` (which tests can be decided on the
host as values) and ``prelude`` (the trusted names the tests may use). ``host/``: what runs in the trainer's process
(the reward's pool, the launcher: bubblewrap, uids, cgroups; the claim of a pool id). ``sandbox/``: the only code
that runs inside the sandbox, laid into it whole, standard library only (the reward's fork-server worker, the tool's
interpreter server, the protocol, the inner layers: rlimits, Landlock, seccomp). Imports neither torch nor trl.
"""

from .environment import PythonEnvironment, PythonTestsEnvironment
from .host.launcher import IsolationUnavailable
from .plugin import CodeSandboxReward, code_sandbox, extract_program, reward

__all__ = ["code_sandbox", "CodeSandboxReward", "IsolationUnavailable", "PythonEnvironment", "PythonTestsEnvironment", "extract_program", "reward"]
