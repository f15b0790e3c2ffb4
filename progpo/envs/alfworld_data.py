"""ALFWorld game data: find (or unpack once) a ``json_2.1.1`` folder and list its games.

The real games (Shridhar et al. 2021, "ALFWorld: Aligning Text and Embodied Environments for
Interactive Learning", MIT license) come as ``json_2.1.1/<split>/<task_type>-<objects>-<scene>/
<trial>/game.tw-pddl``. The folder is found, in order, at:

1. ``data_dir`` given explicitly (a ``json_2.1.1`` folder, or a folder holding one);
2. the environment variable ``ALFWORLD_DATA`` (ALFWorld's own convention: a folder holding
   ``json_2.1.1``; a ``json_2.1.1`` folder itself is accepted too);
3. the unpack cache ``~/.cache/progpo/alfworld/json_2.1.1`` (override with ``PROGPO_ALFWORLD_CACHE``);
4. otherwise the archive ``<data_root>/alfworld/json_2.1.1.tar.xz`` (see ``progpo.paths``) is
   unpacked into that cache once (all of it: xz is one solid stream, so extracting a subset costs
   the same decompression; its time: docs/alfworld.md, "Game data") under a file lock, so that many
   processes (Ray actors) starting together unpack it only once.

A folder that was named explicitly but does not exist raises ``FileNotFoundError`` naming it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

from filelock import FileLock

from progpo.paths import data_root

logger = logging.getLogger(__name__)

DATASET_NAME = "json_2.1.1"
ARCHIVE_NAME = "json_2.1.1.tar.xz"
GAME_FILE = "game.tw-pddl"
SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen", "valid_train")
"""Folder names of the splits (ALFWorld calls valid_seen "eval_in_distribution" and
valid_unseen "eval_out_of_distribution"; valid_train is extra trials of training scenes)."""

TASK_TYPES: dict[str, str] = {
    "pick_and_place_simple": "Pick",
    "look_at_obj_in_light": "Look",
    "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat",
    "pick_cool_then_place_in_recep": "Cool",
    "pick_two_obj_and_place": "Pick2",
}
"""ALFRED task-type folder prefix -> the short name used in papers' per-type tables."""

TASK_TYPE_NAMES: tuple[str, ...] = tuple(TASK_TYPES.values())

_ALFWORLD_DEFAULT_CACHE = Path.home() / ".cache" / "alfworld"
_COMPLETE_MARKER = ".progpo_unpacked"


def cache_dir() -> Path:
    """The folder that receives the unpacked ``json_2.1.1`` (``$PROGPO_ALFWORLD_CACHE`` or
    ``~/.cache/progpo/alfworld``)."""
    env = os.environ.get("PROGPO_ALFWORLD_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "progpo" / "alfworld"


def _as_dataset_dir(folder: Path) -> Path | None:
    """``folder`` if it is a json_2.1.1 folder, ``folder/json_2.1.1`` if that is one, else None."""
    for cand in (folder, folder / DATASET_NAME):
        if any((cand / split).is_dir() for split in SPLITS):
            return cand
    return None


def check_data(data_dir: str | os.PathLike | None = None) -> None:
    """Check, without unpacking anything, that ALFWorld's games can be found from here: the folder
    :func:`resolve_data_dir` would play from, or (no ``data_dir`` given) the archive it would unpack
    from the data root (``progpo.paths.data_root() / "alfworld"``).

    Raises:
        FileNotFoundError: naming the missing folder or archive, and how to point at the data.
    """
    from progpo.paths import data_root

    try:
        resolve_data_dir(data_dir, unpack=False)
    except FileNotFoundError as exc:
        if data_dir is not None or not (data_root() / "alfworld" / ARCHIVE_NAME).is_file():
            raise FileNotFoundError(f"{exc} (pass --env.data_dir, or set PROGPO_DATA to the data folder)") from exc


def resolve_data_dir(data_dir: str | os.PathLike | None = None, *, unpack: bool = True) -> Path:
    """Return the ``json_2.1.1`` folder to play from (see the module docstring for the order).

    Args:
        data_dir: an explicit ``json_2.1.1`` folder or a folder holding one.
        unpack: unpack the archive into the cache when no folder is found (default True).

    Returns:
        A folder whose children are split folders (``train``, ``valid_seen``, ...).

    Raises:
        FileNotFoundError: naming the missing folder or archive.
    """
    if data_dir is not None:
        folder = Path(data_dir).expanduser()
        found = _as_dataset_dir(folder)
        if found is None:
            raise FileNotFoundError(
                f"ALFWorld data_dir {folder} holds no {DATASET_NAME} split folders "
                f"({', '.join(SPLITS)}) and no {DATASET_NAME}/ subfolder"
            )
        return found
    env = os.environ.get("ALFWORLD_DATA")
    if env:
        folder = Path(env).expanduser()
        found = _as_dataset_dir(folder)
        if found is not None:
            return found
        # `import alfworld` sets ALFWORLD_DATA to its own empty default cache; only a user's
        # explicit value that points nowhere is an error.
        if folder.resolve() != _ALFWORLD_DEFAULT_CACHE.resolve():
            raise FileNotFoundError(
                f"ALFWORLD_DATA={folder} holds no {DATASET_NAME} folder "
                f"(expected {folder / DATASET_NAME}/<split>/...)"
            )
    cached = cache_dir() / DATASET_NAME
    if (cached / _COMPLETE_MARKER).exists():
        return cached
    archive = data_root() / "alfworld" / ARCHIVE_NAME
    if not archive.exists():
        raise FileNotFoundError(
            f"ALFWorld games not found: no data_dir given, ALFWORLD_DATA unset, no unpacked cache at "
            f"{cached}, and no archive at {archive}. Pass data_dir=, set ALFWORLD_DATA to a folder "
            f"holding {DATASET_NAME}/, or set PROGPO_DATA to a folder holding alfworld/{ARCHIVE_NAME}"
        )
    if not unpack:
        raise FileNotFoundError(f"ALFWorld cache {cached} is not unpacked (archive at {archive})")
    return unpack_archive(archive, cache_dir())


def unpack_archive(archive: Path, dest: Path) -> Path:
    """Unpack ``archive`` (a ``json_2.1.1.tar.xz``) into ``dest/json_2.1.1`` once, atomically.

    Extraction goes to a temporary folder beside the target and is renamed into place, under a
    file lock, so concurrent callers never see a half-written folder.

    Args:
        archive: the ``.tar.xz`` file.
        dest: the folder that will hold ``json_2.1.1/``.

    Returns:
        ``dest / "json_2.1.1"``.

    Raises:
        FileNotFoundError: ``archive`` is missing. ValueError: the archive has no ``json_2.1.1/``.
    """
    if not archive.exists():
        raise FileNotFoundError(f"ALFWorld archive not found at {archive}")
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / DATASET_NAME
    with FileLock(str(dest / ".unpack.lock")):
        if (target / _COMPLETE_MARKER).exists():
            return target
        logger.info("unpacking %s into %s (once)", archive, dest)
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest))
        try:
            with tarfile.open(archive, "r:xz") as tar:
                tar.extractall(tmp, filter="data")
            if not (tmp / DATASET_NAME).is_dir():
                raise ValueError(f"archive {archive} has no top-level {DATASET_NAME}/ folder")
            if target.exists():  # a half-written folder from an older, interrupted layout
                shutil.rmtree(target)
            (tmp / DATASET_NAME / _COMPLETE_MARKER).touch()
            (tmp / DATASET_NAME).rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@lru_cache(maxsize=32)
def _list_games_cached(dataset_dir: str, split: str) -> tuple[str, ...]:
    root = Path(dataset_dir) / split
    games = sorted(str(p) for p in root.glob(f"*/*/{GAME_FILE}"))
    # ALFWorld's loader skips movable-receptacle and sliced-object tasks (unsupported in text).
    return tuple(g for g in games if "movable" not in g and "Sliced" not in g)


def list_games(dataset_dir: Path, split: str) -> tuple[str, ...]:
    """The sorted game files (absolute ``.../game.tw-pddl`` paths) of ``split``.

    Sorting makes ``index`` stable across machines; all json_2.1.1 games are marked solvable.

    Raises:
        ValueError: unknown ``split``. FileNotFoundError: the split folder is missing or empty.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {list(SPLITS)}")
    root = dataset_dir / split
    if not root.is_dir():
        raise FileNotFoundError(f"ALFWorld split folder not found at {root}")
    games = _list_games_cached(str(dataset_dir), split)
    if not games:
        raise FileNotFoundError(f"ALFWorld split folder {root} holds no */*/{GAME_FILE} games")
    return games


def game_id(game_file: str | os.PathLike) -> str:
    """Stable id of a game: ``<split>/<task folder>/<trial>`` (e.g.
    ``valid_seen/look_at_obj_in_light-AlarmClock-None-DeskLamp-323/trial_T2019...``)."""
    trial_dir = Path(game_file).parent
    return "/".join(trial_dir.parts[-3:])


def task_type_of(game_file: str | os.PathLike) -> str:
    """The short task type (Pick, Look, Clean, Heat, Cool, Pick2) of a game, from its folder name.

    Raises:
        ValueError: the folder name starts with no known ALFRED task type.
    """
    task_folder = Path(game_file).parent.parent.name
    prefix = task_folder.split("-", 1)[0]
    if prefix not in TASK_TYPES:
        raise ValueError(f"game folder {task_folder!r} has unknown task type {prefix!r}")
    return TASK_TYPES[prefix]
