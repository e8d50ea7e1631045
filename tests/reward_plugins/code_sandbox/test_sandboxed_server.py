"""launcher.SandboxedServer: a sandbox server is used only after its hello says it may be (never root, the layers the
isolation needs); anything else is refused with IsolationUnavailable naming the server."""

import re
import sys

import pytest

from reward_plugins.code_sandbox.host import launcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")


def _saying(hello: bytes):
    """A command for a stand-in server that sends ``hello`` and waits for the host to close its channel."""
    code = f"import socket, sys\ns = socket.socket(fileno=int(sys.argv[1]))\ns.send({hello!r})\ns.recv(1)\n"
    return lambda fd: [sys.executable, "-I", "-c", code, str(fd)]


@pytest.mark.parametrize(
    "hello, isolation, needs, why",
    [
        (b'{"uid": 0, "landlock": 3, "seccomp": true}', "bwrap", ("landlock", "seccomp"), "runs as root"),
        (b'{"uid": 1000, "landlock": 0, "seccomp": true}', "bwrap", ("landlock", "seccomp"), "needs landlock and seccomp"),
        (b'{"uid": 1000, "landlock": 3, "seccomp": true}', "bwrap", ("landlock", "seccomp", "private_tmpfs"), "private_tmpfs"),
        (b"[1, 2]", "rlimits", (), "sent [1, 2] for its hello"),
    ],
)
def test_a_server_whose_hello_does_not_qualify_is_refused_and_killed(hello, isolation, needs, why):
    with pytest.raises(launcher.IsolationUnavailable, match="the stand-in server .*" + re.escape(why)):
        launcher.SandboxedServer("the stand-in server", isolation, _saying(hello), None, "", 1 << 30, 64, needs=needs)


def test_a_qualifying_server_is_kept_and_killed_on_request():
    server = launcher.SandboxedServer(
        "the stand-in server", "bwrap", _saying(b'{"uid": 1000, "landlock": 3, "seccomp": true}'), None, "", 1 << 30, 64
    )
    assert server.alive() and server.caps["uid"] == 1000
    assert server.kill() == [] and not server.alive()


def test_a_server_that_never_says_hello_is_refused_with_its_stderr():
    command = lambda fd: [sys.executable, "-I", "-c", "import sys; sys.exit('no sandbox here')", str(fd)]  # noqa: E731
    with pytest.raises(launcher.IsolationUnavailable, match="did not start .*no sandbox here"):
        launcher.SandboxedServer("the stand-in server", "rlimits", command, None, "", 1 << 30, 64)
