"""Writes that a ``kill -9`` at any moment cannot tear: a temporary name, fsync, then an atomic rename
(POSIX ``rename``), and appends of one whole line per ``write`` call, as checkpoints and ``metrics.jsonl`` need.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | os.PathLike) -> None:
    """Flush ``path`` (a file, or a folder: its entries, e.g. a rename in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file under ``root``, then every folder bottom-up, so a rename of ``root`` publishes data on disk."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden temporary file, fsync and a rename: a kill at any moment leaves
    the old content or the new one, never a part."""
    tmp = path.with_name(f".tmp-{path.name}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` + newline to ``path`` in one ``write`` call (``O_APPEND``), then fsync.

    Raises:
        ValueError: ``line`` holds a newline (it would be two records).
    """
    if "\n" in line:
        raise ValueError("append_line: the line holds a newline")
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it whole; a short write (disk full) continues where it stopped
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_lines(path: Path) -> list[str]:
    """The lines of ``path`` that a writer finished (newline-terminated); a last line without its newline (a write
    cut by a kill) is left out, blank lines too."""
    text = path.read_text()
    lines = text.split("\n")[:-1]  # the part after the last newline is unfinished (or empty)
    return [line for line in lines if line.strip()]


def drop_torn_tail(path: Path) -> bool:
    """Cut an unfinished last line (no newline) off ``path``, so the next append starts a line of its own.

    Returns:
        Whether anything was cut.
    """
    if not path.exists():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())
    return True
