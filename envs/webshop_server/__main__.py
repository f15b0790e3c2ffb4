"""``python -m envs.webshop_server --data-dir DIR --port N``: serve WebShop with waitress."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from envs.webshop_server.shop import Shop, ShopConfig


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the server."""
    p = argparse.ArgumentParser(prog="python -m envs.webshop_server", description=__doc__)
    p.add_argument("--data-dir", default=None, help="WebShop data folder (default: $PROGPO_DATA/webshop or ../shared/data/webshop)")
    p.add_argument("--products-file", default=None, help="products file inside --data-dir (e.g. items_shuffle.json)")
    p.add_argument("--num-products", type=int, default=None, help="keep only the first N products")
    p.add_argument("--goal-source", default="auto", choices=["auto", "human", "synthetic"])
    p.add_argument("--split-mode", default="auto", choices=["auto", "standard", "proportional"])
    p.add_argument("--price-seed", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=3000, help="port (0: any free port, printed on stdout)")
    p.add_argument("--threads", type=int, default=8, help="waitress worker threads (per worker process)")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes sharing the loaded catalog (sessions stay on their worker)")
    p.add_argument("--session-ttl-s", type=float, default=3600.0)
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--attrs", action="store_true", help="show the Attributes tab on item pages")
    p.add_argument("--no-cache", action="store_true", help="never cache large catalogs/indexes on disk")
    p.add_argument("--cache-dir", default=None, help="cache folder (default ~/.cache/progpo/webshop)")
    p.add_argument("--cache-min-mb", type=float, default=32.0, help="products files smaller than this load into memory")
    p.add_argument("--search-cache", type=int, default=4096, help="distinct queries whose results are kept (0: none)")
    p.add_argument("--prepare", action="store_true",
                   help="load the catalog (building its cache on a first start), print its summary and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    """Load the shop, bind, print ``LISTENING <url>`` and serve until killed."""
    args = build_parser().parse_args(argv)
    bad = (f"--port must be in [0, 65535], got {args.port}" if not 0 <= args.port < 65536 else
           next((f"--{name} must be >= 1, got {value}" for name, value in (("threads", args.threads),
                 ("workers", args.workers)) if value < 1), None))
    if bad:  # the exit status and form of every other bad flag (argparse's own: 2)
        print(f"error: {bad}", file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from waitress import create_server

    from envs.webshop_server.app import create_app

    t0 = time.perf_counter()
    try:
        shop = Shop(ShopConfig(
            data_dir=args.data_dir, products_file=args.products_file, num_products=args.num_products,
            goal_source=args.goal_source, split_mode=args.split_mode, price_seed=args.price_seed,
            session_ttl_s=args.session_ttl_s, max_sessions=args.max_sessions, show_attrs=args.attrs,
            use_cache=not args.no_cache, cache_dir=args.cache_dir, search_cache=args.search_cache,
            cache_min_mb=args.cache_min_mb, preload_nlp=args.workers == 1))
    except (ValueError, OSError) as e:  # bad data or flags: one line naming the file, no traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if args.prepare:
        print(f"prepared in {time.perf_counter() - t0:.1f} s: {shop.describe()}", flush=True)
        return 0
    if args.workers > 1:
        from envs.webshop_server.workers import serve

        return serve(shop, args.host, args.port, args.workers, args.threads, t0)
    server = create_server(create_app(shop), host=args.host, port=args.port, threads=args.threads,
                           connection_limit=1000, channel_timeout=120, ident="webshop")
    port = server.effective_port  # type: ignore[attr-defined]
    print(f"LISTENING http://{args.host}:{port} ({time.perf_counter() - t0:.2f} s)", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
