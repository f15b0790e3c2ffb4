"""``python -m progpo.cli.data download|where``: get the standard WebShop and ALFWorld data.

``download`` fetches what the benchmarks' own setups fetch, into the folder the training flags
default to (``progpo.paths.USER_DATA_DIR`` = ``~/.cache/progpo/data``, or ``--dir``):

* ``webshop/``: WebShop's ``setup.sh`` files from their published Google Drive location
  (``-d small``: ``items_shuffle_1000.json``, ``items_ins_v2_1000.json``; always
  ``items_human_ins.json``; ``--webshop all`` adds the full ``items_shuffle.json`` (5.1 GB) and
  ``items_ins_v2.json``);
* ``alfworld/``: ALFWorld's own ``alfworld-download`` (``json_2.1.1`` games and PDDL files) with
  ``ALFWORLD_DATA`` pointed there.

Each host is probed first with a short connect timeout, so on a machine without a route to them the
command fails within seconds with a message naming the folder to fill by hand instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from progpo.paths import USER_DATA_DIR

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


def download_webshop(root: Path, which: str, timeout_s: float) -> list[Path]:
    """Fetch the WebShop files of ``which`` ("small"/"all") into ``root/webshop``."""
    out = root / "webshop"
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


def download_alfworld(root: Path, timeout_s: float) -> Path:
    """Run ``alfworld-download`` with ``ALFWORLD_DATA=root/alfworld``."""
    out = root / "alfworld"
    probe(ALFWORLD_HOST, timeout_s)
    exe = shutil.which("alfworld-download")
    if exe is None:
        raise FileNotFoundError("alfworld-download not found: pip install alfworld==0.4.2")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([exe], check=True, env={**os.environ, "ALFWORLD_DATA": str(out)})
    return out


def where(root: Path) -> str:
    """The expected layout of the data folder, as text."""
    return (f"data folder: {root}\n"
            f"  {root / 'webshop'}/   items_shuffle_1000.json, items_ins_v2_1000.json, items_human_ins.json\n"
            f"      (WebShop setup.sh files; the full catalog: items_shuffle.json, 5.1 GB, 1,181,436 products,\n"
            f"      with items_ins_v2.json; the server caches it after its first start)\n"
            f"  {root / 'alfworld'}/  json_2.1.1/ (what alfworld-download writes)\n"
            "The trainer also reads $PROGPO_DATA or --env.data_dir with the same layout.\n"
            "Without the full catalog, a synthetic one in the same format and size (for load tests):\n"
            "  python -m envs.webshop_server.synth --products 1181436 --out DIR")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point. Exit codes: 0 done, 1 a host unreachable or a download failed."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="fetch WebShop and ALFWorld data")
    d.add_argument("--dir", default=str(USER_DATA_DIR), help="data folder")
    d.add_argument("--only", choices=("webshop", "alfworld"), default=None)
    d.add_argument("--webshop", choices=("small", "all"), default="small", help="WebShop catalog size")
    d.add_argument("--timeout_s", type=float, default=5.0, help="connect/read timeout per request")
    w = sub.add_parser("where", help="print the expected data layout")
    w.add_argument("--dir", default=str(USER_DATA_DIR))
    args = p.parse_args(argv)
    root = Path(args.dir).expanduser()
    if args.cmd == "where":
        print(where(root))
        return 0
    try:
        if args.only in (None, "webshop"):
            for path in download_webshop(root, args.webshop, args.timeout_s):
                print(f"ok {path}")
        if args.only in (None, "alfworld"):
            print(f"ok {download_alfworld(root, args.timeout_s)}")
    except (Unreachable, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        sys.stderr.write(
            f"error: download failed: {exc}\n"
            f"This machine cannot fetch the data. Provide it by hand instead:\n{where(root)}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
