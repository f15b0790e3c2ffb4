"""A WebShop server that stops and starts again under running episodes (both clients: the local
backend's ``WebShopEnv`` and the engines' ``AsyncWebShopPool``).

WebShop sessions are server-side state: a restarted server has none of them. What that means:

* an episode whose session the restarted server does not know fails with ``env_session_lost``
  (counted; it is not resumed in a fresh session, whose pages the model never saw);
* a request that finds the server down is retried on connection errors only (nothing reached the
  server), for about ``connect_retries`` backoff rounds; a server back by then answers it, so an
  episode that *starts* while the server restarts runs normally; one still down then fails with
  ``env_unreachable``;
* a request the server dies in the middle of (sent, never answered) fails with ``env_unreachable`` at once:
  whether the server applied the step is unknown, so it is not sent again;
* after the restart, new episodes run on the same client (its keep-alive connections recover).

A tiny loopback stand-in of the session API holds the sessions in memory and is restarted on the same
port (the real server's catalog is not needed for the client's side).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import uuid
from http.server import ThreadingHTTPServer

import pytest

from progpo.envs.base import EnvFailure, EnvUnreachable
from progpo.envs.http_pool import AsyncWebShopPool
from progpo.envs.webshop import WebShopEnv
from progpo_tests.patience import PATIENCE_S, JsonHandler

WAITING_S = 0.5  # a reset that gave up at once would have raised within this


def _view(sid: str) -> dict:
    return {"session_id": sid, "goal_index": 0, "instruction": "buy tea", "observation": "WebShop [SEP] buy tea",
            "available_actions": {"has_search_bar": True, "clickables": ["search"]}, "url": "/x",
            "page": "index", "done": False, "reward": 0.0, "steps": 0, "valid": True, "message": ""}


class SessionServer:
    """The session API in memory on a fixed port; ``restart()`` starts a fresh one (no sessions)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.httpd: ThreadingHTTPServer | None = None
        self.die_mid_step = False  #: read a step request, then close the connection without an answer
        self.steps_cut = 0  #: step requests closed that way

    def start(self) -> None:
        sessions: set[str] = set()
        outer = self

        class Handler(JsonHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/api/sessions":
                    sid = uuid.uuid4().hex
                    sessions.add(sid)
                    return self.send_json(201, _view(sid))
                sid = self.path.split("/")[3]
                if outer.die_mid_step:  # what a server killed while serving the request leaves the client
                    outer.steps_cut += 1
                    self.close_connection = True
                    return None
                if sid not in sessions:  # what the real server answers (envs/webshop_server/app.py)
                    return self.send_json(404, {"error": f"unknown or expired session id {sid!r}"})
                self.send_json(200, _view(sid))

            def do_DELETE(self):
                sessions.discard(self.path.split("/")[3])
                self.send_json(200, {})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def server():
    srv = SessionServer()
    srv.start()
    yield srv
    srv.stop()


class SyncClient:
    """``WebShopEnv`` per episode (the local backend's threads)."""

    def __init__(self, url: str, **kw) -> None:
        self.url, self.kw, self.envs = url, kw, {}
        self.threads = concurrent.futures.ThreadPoolExecutor(4)

    def reset(self, eid: int) -> concurrent.futures.Future:
        self.envs[eid] = WebShopEnv(self.url, timeout_s=PATIENCE_S, **self.kw)
        return self.threads.submit(self.envs[eid].reset, split="test", index=0)

    def step(self, eid: int) -> concurrent.futures.Future:
        return self.threads.submit(self.envs[eid].step, "search[tea]")

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.threads.shutdown()


class AsyncClient:
    """``AsyncWebShopPool`` (the engines' pool), driven on its own event loop thread."""

    def __init__(self, url: str, **kw) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pool = AsyncWebShopPool(url, timeout_s=PATIENCE_S, **kw)

    def _run(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def reset(self, eid: int) -> concurrent.futures.Future:
        return self._run(self.pool.reset(eid, split="test", index=0))

    def step(self, eid: int) -> concurrent.futures.Future:
        return self._run(self.pool.step(eid, "search[tea]"))

    def close(self) -> None:
        self._run(self.pool.close()).result(PATIENCE_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(PATIENCE_S)


CLIENTS = {"sync": SyncClient, "async": AsyncClient}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_restarted_server_loses_the_running_episode_and_serves_new_ones(server, client):
    c = CLIENTS[client](server.url)
    try:
        c.reset(0).result(PATIENCE_S)
        assert not c.step(0).result(PATIENCE_S).done
        server.restart()
        with pytest.raises(EnvFailure) as err:
            c.step(0).result(PATIENCE_S)
        assert err.value.kind == "env_session_lost"
        assert server.url in str(err.value) and "restarted" in str(err.value)
        c.reset(1).result(PATIENCE_S)  # a new episode on the same client, on the restarted server
        assert not c.step(1).result(PATIENCE_S).done
    finally:
        c.close()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_reset_while_the_server_restarts_waits_for_it(server, client):
    c = CLIENTS[client](server.url)
    try:
        server.stop()
        pending = c.reset(0)
        with pytest.raises(concurrent.futures.TimeoutError):  # retrying the refused connection, not failed
            pending.result(WAITING_S)
        server.start()
        obs, _ = pending.result(PATIENCE_S)
        assert obs.startswith("WebShop")
        assert not c.step(0).result(PATIENCE_S).done
    finally:
        c.close()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_server_that_stays_down_fails_the_episode_as_unreachable(server, client):
    c = CLIENTS[client](server.url, connect_retries=1)
    try:
        c.reset(0).result(PATIENCE_S)
        server.stop()
        with pytest.raises(EnvUnreachable, match=f"WebShop server at {server.url} unreachable"):
            c.step(0).result(PATIENCE_S)
    finally:
        c.close()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_server_dying_mid_step_fails_the_episode_as_unreachable_without_resending(server, client):
    c = CLIENTS[client](server.url)
    try:
        c.reset(0).result(PATIENCE_S)
        server.die_mid_step = True
        with pytest.raises(EnvUnreachable, match=f"WebShop server at {server.url} unreachable"):
            c.step(0).result(PATIENCE_S)
        assert server.steps_cut == 1  # not sent again: the server may have applied it
        server.die_mid_step = False
        assert not c.step(0).result(PATIENCE_S).done  # the server still knows the session: the client recovers
    finally:
        c.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_bad_connect_retries_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=f"connect_retries must be an int >= 0, got {bad!r}"):
        WebShopEnv("http://127.0.0.1:1", connect_retries=bad)
    with pytest.raises(ValueError, match=f"connect_retries must be an int >= 0, got {bad!r}"):
        AsyncWebShopPool("http://127.0.0.1:1", connect_retries=bad)
