"""Fetch the standard WebShop and ALFWorld data (the env specs' ``download``; ``python -m progpo.cli.data``).

Each host is probed first with a short connect timeout, so on a machine without a route to them the
download fails within seconds (:class:`Unreachable`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

GDRIVE = "https://drive.google.com/uc?export=download&confirm=t&id={}"
WEBSHOP_FILES = {  # WebShop setup.sh (princeton-nlp/WebShop), file name -> Google Drive id
    "small": {
        "items_shuffle_1000.json": "1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib",
        "items_ins_v2_1000.json": "1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu",
        "items_human_ins.json": "14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O",
    },
    "all": {
        "items_shuffle.json": "1A2whVgOO0euk5O13n2iYDM0bQRkkRduB",
        "items_ins_v2.json": "1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi",
        "items_human_ins.json": "14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O",
    },
}
ALFWORLD_HOST = "https://github.com"  # alfworld-download fetches GitHub release assets


class Unreachable(RuntimeError):
    """A data host cannot be reached from this machine."""


def probe(url: str, timeout_s: float) -> None:
    """Open (and close) a TCP connection to ``url``'s host; ``Unreachable`` if it fails in ``timeout_s``."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise Unreachable(f"{parsed.hostname}:{port} unreachable ({exc})") from exc


def _fetch(url: str, dest: Path, timeout_s: float) -> None:
    import requests

    tmp = dest.with_name(f".tmp-{dest.name}")
    with requests.get(url, stream=True, timeout=timeout_s) as r:
        r.raise_for_status()
        if "text/html" in r.headers.get("content-type", ""):
            raise RuntimeError(f"{url} returned an HTML page instead of the file (Drive quota or link change?)")
        with tmp.open("wb") as f:
            for chunk in r.iter_content(1 << 20):
                f.write(chunk)
    os.replace(tmp, dest)


def download_webshop(out: Path, timeout_s: float, *, webshop: str = "small", **_: Any) -> list[Path]:
    """WebShop's spec ``download``: fetch the files of catalog size ``webshop`` ("small"/"all") into ``out``
    (``<data root>/<its spec's data_subdir>``)."""
    which = webshop
    probe(GDRIVE.format(""), timeout_s)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for name, file_id in WEBSHOP_FILES[which].items():
        dest = out / name
        if not dest.exists():
            print(f"fetching {name} ...", flush=True)
            _fetch(GDRIVE.format(file_id), dest, timeout_s)
        done.append(dest)
    return done


def download_alfworld(out: Path, timeout_s: float, **_: Any) -> Path:
    """ALFWorld's spec ``download``: run ``alfworld-download`` with ``ALFWORLD_DATA=out``
    (``<data root>/<its spec's data_subdir>``)."""
    probe(ALFWORLD_HOST, timeout_s)
    exe = shutil.which("alfworld-download")
    if exe is None:
        raise FileNotFoundError("alfworld-download not found: pip install alfworld==0.4.2")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([exe], check=True, env={**os.environ, "ALFWORLD_DATA": str(out)})
    return out
