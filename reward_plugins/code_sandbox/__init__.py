"""``code_sandbox``: run model-written code against tests in a sandbox, as a TRL reward function.

Modules: ``plugin`` (the reward function face), ``pool`` (sandboxed fork-server workers),
``isolation`` (bubblewrap, uid drop, rlimits, Landlock, seccomp), ``protocol`` (the verdict
channels and the data-only codec), ``worker`` (the fork server that runs inside the sandbox);
``environment`` (``PythonEnvironment``, the sandboxed Python tool for TRL's ``environment_factory``)
and ``interpreter`` (its fork server of persistent interpreters, inside the same layers).
Imports neither torch nor trl.
"""

from .environment import PythonEnvironment, PythonTestsEnvironment
from .isolation import IsolationUnavailable
from .plugin import CodeSandboxReward, code_sandbox, extract_program, reward

__all__ = ["code_sandbox", "CodeSandboxReward", "IsolationUnavailable", "PythonEnvironment", "PythonTestsEnvironment", "extract_program", "reward"]
