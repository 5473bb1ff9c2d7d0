"""Reading a file named by a user: regular files only, never more than a cap, one-line errors.

A path on a command line may name anything: /dev/zero (endless), a FIFO (blocks until someone writes),
a directory, or a file of gigabytes. Every input file (config packs, sweep and model YAML) is read here,
so none of them can hang the process or fill its memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from moetune.kernels.errors import MoetuneError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_input_file(path: str | Path, *, limit: int, what: str, error: type[MoetuneError]) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; else `error` naming the file.

    `what` names the file in messages ("config pack"). The file is opened non-blocking, so that a FIFO
    is refused rather than waited on, and its type and size are read from the open descriptor, so the
    checks hold for what is actually read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
            raise error(f"cannot read {what} {path}: it is {kind}, not a regular file")
        if info.st_size > limit:
            raise error(f"{what} {path} holds {info.st_size} bytes; the limit is {limit}")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from e
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after fstat
        raise error(f"{what} {path} holds more than {limit} bytes, the limit")
    return data
