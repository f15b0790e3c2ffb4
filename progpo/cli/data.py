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
import subprocess
import sys
from pathlib import Path

from progpo.envs import env_ids, spec
from progpo.paths import USER_DATA_DIR
from progpo.envs.download import Unreachable

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
    d.add_argument("--only", choices=[n for n in env_ids() if spec(n).download], default=None,
                   help="fetch only this env's data (default: every env that has data to fetch)")
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
        for name in env_ids():
            if spec(name).download is None or args.only not in (None, name):
                continue
            got = spec(name).load("download")(root / spec(name).data_subdir, args.timeout_s, webshop=args.webshop)
            for path in got if isinstance(got, list) else [got]:
                print(f"ok {path}")
    except (Unreachable, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        sys.stderr.write(
            f"error: download failed: {exc}\n"
            f"This machine cannot fetch the data. Provide it by hand instead:\n{where(root)}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
