"""A pool's identity (host side): an id no other live pool holds, and reclaiming what dead ones left.

The id is drawn at random, never derived from the pid (two trainers in containers are both pid 1),
and claimed exclusively wherever two pools can meet:

* the code dir ``<tmp>/code_sandbox-pool-<id>`` (``mkdir``; the workers' code is copied there), on
  which the pool holds an ``flock`` for as long as it lives: the proof of life. The kernel drops
  the lock when the last process holding it is gone, SIGKILL included.
* ``code_sandbox-pool-<id>`` under our own cgroup in each controller (``mkdir``, root only), the
  parent of the pool's worker cgroups: pools that share a cgroup hierarchy cannot share a name.

The sandbox uids derive from the id (``launcher.slot_uid``). Where two pools share neither /tmp
nor a cgroup hierarchy, ids (and so uids) still differ unless two random draws of 26 bits meet.

At every pool's start, ``reclaim_stale`` removes what a SIGKILLed host left behind: each code dir
of ours whose lock can be taken belongs to a pool that is gone (only that is proof: a dir whose
holder lives, or that some other user owns, is never touched), and with it go its cgroups (the
processes still in them are that pool's workers) and the dir.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
import tempfile

from . import launcher

log = logging.getLogger(__package__)  # one logger for the whole package

PREFIX = "code_sandbox-pool-"
_NAME = re.compile(re.escape(PREFIX) + r"([1-9][0-9]{0,9})")


def _lock_dir(path: str) -> int | None:
    """An fd on the directory ``path`` (ours, not a symlink) holding its exclusive lock, or None
    when another process holds it (or ``path`` is not such a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise OSError("not ours")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):  # removed and re-made meanwhile
            raise OSError("replaced")
        return fd
    except OSError:
        os.close(fd)
        return None


class PoolClaim:
    """An id claimed for one pool (``acquire``), its code dir and cgroup claim; ``release`` ends it."""

    def __init__(self, pool_id: int, code_dir: str, lock_fd: int, cgroups: list[str]):
        self.id, self.code_dir, self._fd, self.cgroups = pool_id, code_dir, lock_fd, cgroups

    @property
    def cgroup_name(self) -> str:
        return PREFIX + str(self.id)

    @classmethod
    def acquire(cls, root: str | None = None, tries: int = 64) -> "PoolClaim":
        root = root or tempfile.gettempdir()
        reclaim_stale(root)
        for _ in range(tries):
            pool_id = 1 + secrets.randbelow(launcher.POOL_IDS - 1)
            path = os.path.join(root, PREFIX + str(pool_id))
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            fd = _lock_dir(path)
            if fd is None:  # a reclaimer took it between our mkdir and our lock: it removes it
                continue
            try:
                cgroups = launcher.cgroup_claim(PREFIX + str(pool_id))
            except FileExistsError:  # a pool outside our /tmp, sharing our cgroups, has this id
                shutil.rmtree(path, ignore_errors=True)
                os.close(fd)
                continue
            return cls(pool_id, path, fd, cgroups)
        raise RuntimeError(f"code_sandbox: no free pool id after {tries} tries under {root}")

    def release(self, wait_s: float = 2.0):
        """Remove the pool's cgroups (their processes killed) and code dir, then drop the lock."""
        if self._fd is None:
            return
        left = launcher.cgroup_remove(self.cgroups, wait_s)
        if left:  # the code dir stays as the record of what is left, reclaimable once we unlock
            log.warning("code_sandbox: cgroups %s still busy; the next pool's start reclaims them", left)
        else:
            shutil.rmtree(self.code_dir, ignore_errors=True)
        os.close(self._fd)
        self._fd = None


def reclaim_stale(root: str) -> list[int]:
    """Remove the cgroups and code dirs of pools that are gone (their lock is free) -> their ids."""
    done = []
    try:
        names = os.listdir(root)
    except OSError:
        return done
    for name in names:
        m = _NAME.fullmatch(name)
        if not m:
            continue
        path = os.path.join(root, name)
        fd = _lock_dir(path)
        if fd is None:  # alive, or not a dir of ours
            continue
        try:
            dirs = [os.path.join(launcher.cgroup_base(c), name) for c in ("memory", "pids", "cpu")] if os.geteuid() == 0 else []
            cpu = launcher.cgroup_base("cpu")  # the Python tool's interpreters' cpu cgroups, beside the claim's
            dirs += [d for d in launcher.cgroup_subdirs(cpu) if os.path.basename(d).startswith(name + "-i")]
            left = launcher.cgroup_remove([d for d in dirs if os.path.isdir(d)], wait_s=2.0)
            if left:  # still busy: keep the record, try again at the next start
                continue
            shutil.rmtree(path, ignore_errors=True)
            done.append(int(m.group(1)))
        finally:
            os.close(fd)
    if done:
        log.warning("code_sandbox: reclaimed the cgroups and code dirs of %d pool(s) whose host is gone: %s", len(done), done)
    return done
