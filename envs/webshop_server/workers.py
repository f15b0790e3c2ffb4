"""Serve one loaded shop from N worker processes that share its memory-mapped catalog and index.

The parent loads the shop once (from the disk cache: memory maps, no product decoded), binds the
public listening socket and one private socket per worker, then forks the workers: each accepts
new connections on the shared socket (the kernel spreads them) and serves its own sessions on its
private address, which session views carry as ``session_url`` (clients send a session's later
requests there; a request that reaches another worker is redirected with HTTP 307, since session
ids carry their worker's index). Read-only maps and ``pread`` share the catalog through the page
cache, so N workers cost N interpreters and spaCy models, not N catalogs.

The parent supervises: SIGTERM/SIGINT stops every worker; a worker that dies takes the server down
(exit 1) rather than silently losing its sessions; workers exit when the parent disappears.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)  # the supervisor is gone (e.g. SIGKILL): do not linger


def _run_worker(index: int, shop: Any, shared: socket.socket, own: socket.socket, urls: list[str],
                threads: int) -> None:
    from waitress import create_server

    from envs.webshop_server.app import create_app

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True, name="parent-watch").start()
    shop.set_worker(index, urls)
    shop.start_nlp_preload()
    server = create_server(create_app(shop), sockets=[shared, own], threads=threads, connection_limit=1000,
                           channel_timeout=120, ident="webshop")
    log.info("worker %d serving its sessions at %s", index, urls[index])
    server.run()


def serve(shop: Any, host: str, port: int, workers: int, threads: int, t0: float) -> int:
    """Fork ``workers`` processes serving ``shop`` on ``host:port``; supervise until stopped.

    Prints ``LISTENING <url>`` once the sockets are bound. Returns the exit code.
    """
    shared = socket.create_server((host, port), backlog=2048)
    own = [socket.create_server((host, 0), backlog=1024) for _ in range(workers)]
    urls = [f"http://{host}:{s.getsockname()[1]}" for s in own]
    children: list[int] = []
    for i in range(workers):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for j, s in enumerate(own):
                    if j != i:
                        s.close()
                _run_worker(i, shop, shared, own[i], urls, threads)
            except BaseException:  # noqa: BLE001 - reported, then the worker exits
                log.exception("worker %d failed", i)
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"LISTENING http://{host}:{shared.getsockname()[1]} ({time.perf_counter() - t0:.2f} s; "
          f"{workers} workers: {', '.join(urls)})", flush=True)
    code, alive = 0, set(children)
    while alive:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        alive.discard(pid)
        if not stopping:
            log.error("worker process %d exited (status %d); stopping the server", pid, status)
            code = 1
            stop(signal.SIGTERM, None)
    sys.stdout.flush()
    return code
