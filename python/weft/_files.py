"""Writing result files safely: the destination checked before the work that produces it, and the
file replaced atomically (a temporary file in the same folder, flushed to disk, then renamed), so a
full disk or an interrupted write leaves the old file as it was."""
from __future__ import annotations

import os
import tempfile
from typing import Callable, IO


def check_writable(path: str, what: str) -> None:
    """ValueError (one line) unless ``path`` can be written: not a directory, its folder exists and
    is writable. Called before the long work whose result goes there."""
    if not path or path == "-":
        return
    if os.path.isdir(path):
        raise ValueError(f"{what}: {path!r} is a directory (give a file name)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{what}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{what}: {path!r} is not writable")


def write_atomically(path: str, write: Callable[[IO], None], binary: bool = False) -> None:
    """Calls ``write(f)`` on a temporary file beside ``path``, flushes it to disk and renames it
    over ``path``. On any failure the temporary file is removed, ``path`` is untouched, and the
    error is raised as OSError naming the file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):  # keep the old file's permissions
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OSError(e.errno, f"could not write {path!r} ({e.strerror or e}); the old file is unchanged") from None
        raise


def write_text(path: str, text: str) -> None:
    """``text`` to ``path``, atomically (write_atomically)."""
    write_atomically(path, lambda f: f.write(text))
