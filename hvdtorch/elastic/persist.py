"""Atomic, durable files for elastic commits.

A commit is written to a temporary file in the same directory, flushed and
fsynced, then renamed over the previous one (os.replace is atomic on POSIX
file systems), and the directory is fsynced so that the rename itself
survives a crash. A process killed at any point therefore leaves either the
previous commit or the new one, never a torn file; what it may leave is its
temporary file, which the next writer on that host removes.

Temporary files are named .<file>.<host>.<pid>.tmp so that writers on several
hosts sharing one directory (NFS) never remove each other's work in progress.
"""

import os
from typing import Any, Optional

import torch

from ..launch import hostname


def _host() -> str:
    name = hostname()
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _sweep(directory: str, filename: str) -> None:
    """Removes temporary files of `filename` left on this host by dead writers."""
    prefix = f".{filename}.{_host()}."
    for entry in os.listdir(directory):
        if not (entry.startswith(prefix) and entry.endswith(".tmp")):
            continue
        pid = entry[len(prefix) : -len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join(directory, entry))
            except FileNotFoundError:  # another process of this host swept it first
                pass


def write_atomically(path: str, obj: Any) -> None:
    """Saves `obj` (torch.save) at `path`, replacing what was there in one step."""
    directory, filename = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    _sweep(directory, filename)
    tmp = os.path.join(directory, f".{filename}.{_host()}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str) -> Optional[Any]:
    """The object saved at `path`, or None if there is none.

    Loads with weights_only=False: a commit holds arbitrary picklable extras,
    and the file is one this job wrote itself."""
    if not os.path.exists(path):
        return None
    return torch.load(path, weights_only=False)
