"""Adversarial input to the WebShop server: JSON bombs, navigation after purchase, one session hammered
from many threads. Every bad request gets 4xx JSON, and the server and the session stay consistent."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from progpo_tests.patience import PATIENCE_S


def _new(base: str, index: int = 0) -> str:
    r = requests.post(f"{base}/api/sessions", json={"split": "test", "index": index}, timeout=PATIENCE_S)
    assert r.status_code == 201, r.text[:200]
    return r.json()["session_id"]


def _step(base: str, sid: str, action: str, session=requests) -> dict:
    r = session.post(f"{base}/api/sessions/{sid}/step", json={"action": action}, timeout=PATIENCE_S)
    assert r.status_code == 200, (action, r.status_code, r.text[:200])
    return r.json()


def test_json_bombs_get_400_not_500(server):
    base = server.url
    sid = _new(base)
    bodies = {
        "integer past the 4300-digit limit": b'{"split": "test", "index": ' + b"1" * 5000 + b"}",
        "nesting past the recursion limit": b"[" * 30_000 + b"]" * 30_000,
    }
    for url in (f"{base}/api/sessions", f"{base}/api/sessions/{sid}/step"):
        for what, body in bodies.items():
            r = requests.post(url, data=body, timeout=PATIENCE_S)
            assert r.status_code == 400, (what, url, r.status_code, r.text[:200])
            assert "error" in r.json(), what
    # the session is untouched and the server still serves
    view = requests.get(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S).json()
    assert view["steps"] == 0 and view["page"] == "index"
    assert requests.get(f"{base}/health", timeout=PATIENCE_S).json()["status"] == "ok"
    requests.delete(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S)


def test_odd_field_types_and_unicode_digits_get_4xx(server):
    base = server.url
    sid = _new(base)
    cases = [
        ("post", "/api/sessions", {"json": {"split": [], "index": 0}}, 400),  # unhashable split
        ("post", "/api/sessions", {"json": {"split": {"a": 1}, "index": 0}}, 400),
        ("get", f"/search_results/{sid}/x/%C2%B2", {}, 400),  # "²": str.isdigit() but not int()
        ("get", f"/item_page/{sid}/B06Y3VLDFB/x/%C2%B2/%7B%7D", {}, 400),
    ]
    for method, path, kwargs, status in cases:
        r = getattr(requests, method)(base + path, timeout=PATIENCE_S, **kwargs)
        assert r.status_code == status, (path, r.status_code, r.text[:200])
        assert "error" in r.json(), path
    assert requests.get(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S).json()["page"] == "index"
    requests.delete(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S)


def _buy_first_result(base: str, sid: str) -> dict:
    view = _step(base, sid, "search[shirt]")
    asin = next(a for a in view["available_actions"]["clickables"] if a.startswith("b0"))
    _step(base, sid, f"click[{asin}]")
    bought = _step(base, sid, "click[buy now]")
    assert bought["done"] and bought["page"] == "done"
    return bought


def test_browser_navigation_after_purchase_keeps_done_page(server):
    base = server.url
    sid = _new(base, index=1)
    bought = _buy_first_result(base, sid)
    for path in (f"/search_results/{sid}/x/1", f"/item_sub_page/{sid}/B06Y3VLDFB/x/1/Features/%7B%7D",
                 f"/item_page/{sid}/B06Y3VLDFB/x/1/%7B%7D", f"/{sid}"):
        r = requests.get(base + path, timeout=PATIENCE_S)
        assert r.status_code == 200, (path, r.status_code)
    view = requests.get(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S).json()
    assert view["done"] and view["page"] == "done", view["page"]
    assert view["reward"] == bought["reward"] and view["url"] == bought["url"]
    assert view["available_actions"] == bought["available_actions"]
    after = _step(base, sid, "search[tea]")
    assert not after["valid"] and after["page"] == "done"
    requests.delete(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S)


def test_one_session_from_many_threads_counts_every_step(server):
    """16 threads x 20 actions on ONE session: no error, every step counted once, state readable."""
    base = server.url
    sid = _new(base, index=2)
    _step(base, sid, "search[shirt]")
    actions = ["search[shirt]", "click[next >]", "click[< prev]", "click[back to search]", "search[tea]",
               "click[description]", "click[b09nnmv9ln]"]

    def hammer(k: int) -> list[int]:
        with requests.Session() as http:
            steps = []
            for i in range(20):
                steps.append(_step(base, sid, actions[(k + i) % len(actions)], http)["steps"])
                if i % 5 == 0:
                    r = http.get(f"{base}/search_results/{sid}/%5B%27tea%27%5D/1", timeout=PATIENCE_S)
                    assert r.status_code == 200, r.text[:200]
            return steps

    with ThreadPoolExecutor(max_workers=16) as pool:
        seen = sorted(s for steps in pool.map(hammer, range(16)) for s in steps)
    assert seen == list(range(2, 2 + 16 * 20))  # each step saw a distinct, gap-free counter
    view = requests.get(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S).json()
    assert view["steps"] == 1 + 16 * 20 and not view["done"]
    requests.delete(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S)


def test_failed_start_cleans_up_and_can_be_retried(tmp_path):
    """A server that exits at start (corrupt products file) leaves no process or log file behind."""
    from envs.webshop_server.process import WebShopServerProcess

    data = tmp_path / "corrupt"
    data.mkdir()
    (data / "items_shuffle_prefix.json").write_text('[{"asin": "B0", "name": ')  # cut mid-object
    (data / "items_ins_v2_1000.json").write_text("{}")
    proc = WebShopServerProcess(data_dir=data, port=0, start_timeout_s=PATIENCE_S)
    for _ in range(2):  # a second start() is allowed: the first left nothing running
        with pytest.raises(RuntimeError, match="exited with code"):
            proc.start()
        assert proc.proc is None and proc._log is None  # noqa: SLF001


def test_start_returns_once_the_reward_pipeline_is_loaded(webshop_dir):
    """``start()`` waits for ``nlp_ready``: spaCy loads in a background thread after the server
    answers, and requests arriving meanwhile (the first purchase waits for it) timed out on a
    loaded machine. ``wait_nlp=False`` keeps the benchmark's start time (first answer)."""
    from envs.webshop_server.process import WebShopServerProcess

    with WebShopServerProcess(data_dir=webshop_dir, port=0, threads=2, start_timeout_s=PATIENCE_S) as server:
        assert requests.get(f"{server.url}/health", timeout=PATIENCE_S).json()["nlp_ready"] is True
        assert server.start_seconds is not None and server.start_seconds > 0


def test_missing_data_folder_is_named_before_any_process_starts(tmp_path):
    """A missing folder or catalog file is a FileNotFoundError naming it, not a server log tail."""
    from envs.webshop_server.process import WebShopServerProcess

    proc = WebShopServerProcess(data_dir=tmp_path / "missing", port=0)
    with pytest.raises(FileNotFoundError, match="WebShop data folder not found at .*missing"):
        proc.start()
    assert proc.proc is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no WebShop products file in .*empty"):
        WebShopServerProcess(data_dir=tmp_path / "empty", port=0).start()


@pytest.mark.parametrize("value", [math.nan, 0.0, -1.0])
def test_session_ttl_must_be_a_positive_number(value):
    """NaN compared false with every idle time, so sessions never expired."""
    from envs.webshop_server.shop import ShopConfig

    with pytest.raises(ValueError, match="session_ttl_s"):
        ShopConfig(session_ttl_s=value)


def test_async_env_treats_a_refused_action_like_the_sync_env(server):
    """An action the server refuses (413: longer than the query limit + 20) is an invalid no-op in
    both clients; it used to raise ValueError out of ``astep`` and end the whole rollout. After
    truncation both repeat the end state (terminated=False, truncated=True)."""
    import asyncio

    import httpx

    from progpo.envs.webshop import WebShopEnv
    from progpo.envs.http_pool import AsyncWebShopEnv

    long_action = "search[" + "a" * 550 + "]"
    sync = WebShopEnv(server.url, max_steps=2, timeout_s=PATIENCE_S)
    sync.reset(split="test", index=3)
    expected = [sync.step(long_action), sync.step("search[tea]"), sync.step("search[tea]")]
    sync.close()

    async def run() -> list:
        async with httpx.AsyncClient() as client:
            env = AsyncWebShopEnv(client, server.url, max_steps=2, timeout_s=PATIENCE_S)
            await env.areset(split="test", index=3)
            out = [await env.astep(long_action), await env.astep("search[tea]"), await env.astep("search[tea]")]
            await env.aclose()
            return out

    got = asyncio.run(run())
    assert got[0].info["invalid_action"] and got[0].reward == 0.0 and not got[0].done
    for a, b in zip(got, expected):
        assert (a.terminated, a.truncated, a.info["invalid_action"], a.observation) == \
            (b.terminated, b.truncated, b.info["invalid_action"], b.observation)


@pytest.mark.parametrize("argv, says", [
    (["--workers", "0"], "--workers must be >= 1, got 0"),      # was exit 1 without 'error:'
    (["--threads", "-1"], "--threads must be >= 1, got -1"),
    (["--port", "70000"], "--port must be in [0, 65535], got 70000"),
    (["--cache-min-mb", "nan"], "cache_min_mb must be a finite number >= 0, got nan"),  # never cached, silently
    (["--cache-min-mb", "-1"], "cache_min_mb must be a finite number >= 0, got -1.0"),
    (["--cache-min-mb", "0", "--cache-dir", "{file}"], "catalog cache folder (--cache-dir) {file} is a file"),
    (["--cache-min-mb", "0", "--cache-dir", "{file}/sub"], "catalog cache folder (--cache-dir) {file}/sub is a file"),
])
def test_server_flags_refused_in_one_line(webshop_dir, tmp_path, capsys, argv, says):
    """Bad server flags exit 2 with one ``error:`` line naming the value (the cache-dir ones were
    an errno line naming neither the flag nor what to do)."""
    from envs.webshop_server.__main__ import main

    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    argv = [a.replace("{file}", str(blocker)) for a in argv]
    assert main(["--data-dir", str(webshop_dir), "--prepare", *argv]) == 2
    assert f"error: {says.replace('{file}', str(blocker))}" in capsys.readouterr().err
    assert blocker.read_text() == "keep me"


def _exit_2(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_synth_never_overwrites_data_it_did_not_write(tmp_path, capsys):
    """``--out`` on a real WebShop data folder overwrote its items_shuffle.json; a file as ``--out``
    was a FileExistsError traceback. A folder of the generator's own (synth.json) is still reused."""
    from envs.webshop_server import synth

    real = tmp_path / "real"
    real.mkdir()
    (real / "items_shuffle.json").write_text('[{"asin": "REAL"}]')
    err = _exit_2(synth.main, ["--products", "5", "--human-goals", "2", "--out", str(real)], capsys)
    assert f"{real} holds WebShop files this generator did not write (items_shuffle.json" in err
    assert (real / "items_shuffle.json").read_text() == '[{"asin": "REAL"}]'
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    for out in (blocker, blocker / "sub"):
        assert f"output folder {out} is a file" in _exit_2(synth.main, ["--products", "5", "--out", str(out)], capsys)
    assert blocker.read_text() == "keep me"
    ours = tmp_path / "ours"
    for n in (5, 7):  # regenerating into its own folder is fine
        assert synth.main(["--products", str(n), "--human-goals", "2", "--out", str(ours)]) == 0
    assert json.loads((ours / synth.MARKER).read_text())["products"] == 7


@pytest.mark.parametrize("argv, says", [
    (["--workers", "0"], "--workers must be >= 1, got 0"),     # failed only after the catalog was prepared
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--sessions", "1", "0"], "--sessions must be >= 1, got 0"),
    (["--rollout.batch_size", "0"], "--rollout.batch_size must be >= 1, got 0"),  # no episodes: --skip episodes
    (["--rollout.n_samples_per_prompt", "-1"], "--rollout.n_samples_per_prompt must be >= 1, got -1"),
    (["--search_cache", "-1"], "--search_cache must be >= 0, got -1"),
    (["--original_mem_gb", "nan"], "--original_mem_gb must be a finite number > 0, got nan"),
    (["--cache_dir", "{precious}"], "--cache_dir {precious} is not empty and is not a benchmark cache"),  # was emptied
    (["--cache_dir", "{precious}/notes.txt"], "--cache_dir {precious}/notes.txt is a file"),
])
def test_bench_refuses_bad_flags_before_touching_anything(webshop_dir, tmp_path, capsys, argv, says):
    from benchmarks import webshop as bench

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    argv = [a.replace("{precious}", str(precious)) for a in argv]
    err = _exit_2(bench.main, ["--env.data_dir", str(webshop_dir), "--skip", "latency", "search", *argv], capsys)
    assert f"error: {says.replace('{precious}', str(precious))}" in err
    assert (precious / "notes.txt").read_text() == "keep me"
