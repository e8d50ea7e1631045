"""The sandbox side of ``code_sandbox``: the only code a sandbox server runs, laid into the sandbox whole
(``host.launcher.install_sandbox_code``). Standard library only, and nothing from the host side
(``tests/test_layout.py`` holds it). ``worker`` (the reward's fork server), ``interpreter`` (the Python tool's
server of persistent interpreters), ``protocol`` (the verdict channels and the data-only codec), ``layers``
(the inner isolation layers every child enters)."""
