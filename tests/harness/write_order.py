"""The order in which files appear in a folder, from Linux inotify (ctypes; no dependency).

File timestamps cannot order a checkpoint's files: the kernel stamps them with a coarse clock, so files written
within a few milliseconds share one mtime. inotify reports each creation and each completed write in order.
"""

from __future__ import annotations

import ctypes
import os
import struct

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name, len bytes)


class WriteOrder:
    """Watch ``folder`` (which must exist); :meth:`events` gives [(kind, name)] in order, kind one of "create",
    "written" (closed after writing) and "renamed" (moved in: an atomic write)."""

    def __init__(self, folder):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if self.libc.inotify_add_watch(self.fd, os.fsencode(folder), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")
        self.seen = []

    def events(self) -> list[tuple[str, str]]:
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                _, mask, _, length = _HEADER.unpack_from(data, offset)
                name = data[offset + _HEADER.size: offset + _HEADER.size + length].rstrip(b"\0").decode()
                offset += _HEADER.size + length
                kind = "renamed" if mask & IN_MOVED_TO else "create" if mask & IN_CREATE else "written"
                self.seen.append((kind, name))
        return list(self.seen)

    def close(self):
        os.close(self.fd)
