"""Full-scale WebShop, tested small: the generator, the disk store, the content-keyed cache and the
BM25 builder (issue 13). Figures at 1.18M products come from ``python -m benchmarks webshop``."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc

import bm25s
import numpy as np
import pytest

from envs.webshop_server.catalog import iter_json_array
from envs.webshop_server.search import IndexBuilder, SearchIndex, analyze, document_text
from envs.webshop_server.shop import Shop, ShopConfig
from envs.webshop_server.synth import generate, synthetic_asin
from progpo.paths import REPO_ROOT


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def synth_dir(webshop_dir, tmp_path_factory):
    """A 2,000-product synthetic catalog with 600 human instructions."""
    out = tmp_path_factory.mktemp("synth") / "data"
    generate(out, 2000, human_goals=600, src=webshop_dir)
    return out


def test_generator_is_deterministic_standard_and_varied(webshop_dir, synth_dir, tmp_path):
    again = generate(tmp_path / "again", 2000, human_goals=600, src=webshop_dir)
    for name, path in again.items():
        assert _sha(path) == _sha(synth_dir / path.name), name
    prefix = generate(tmp_path / "prefix", 500, human_goals=0, src=webshop_dir)
    products = json.loads((synth_dir / "items_shuffle.json").read_text())
    assert json.loads(prefix["products"].read_text()) == products[:500]  # product i depends on i only
    real = json.loads((webshop_dir / "items_shuffle_prefix.json").read_text())
    real_keys = set.intersection(*(set(p) for p in real))  # the 24 fields every real product has
    assert len(products) == 2000 and all(real_keys <= set(p) for p in products) and len(real_keys) >= 24
    assert len({p["asin"] for p in products}) == 2000 and all(len(p["asin"]) == 10 for p in products)
    assert len({p["name"] for p in products}) > 0.85 * len(products)  # not copies of 87 products
    assert len({p["pricing"] for p in products}) > 0.8 * len(products)
    assert len({json.dumps(p["customization_options"]) for p in products}) > 0.3 * len(products)
    attrs = json.loads((synth_dir / "items_ins_v2.json").read_text())
    assert list(attrs) == [p["asin"] for p in products]
    with_instruction = [v for v in attrs.values() if "instruction" in v]
    assert 0.3 < len(with_instruction) / len(attrs) < 0.5
    assert all(v["instruction"].startswith("Find me ") and v["instruction_attributes"] for v in with_instruction)
    human = json.loads((synth_dir / "items_human_ins.json").read_text())
    entries = [e for items in human.values() for e in items]
    assert len(entries) == 600 and set(human) <= set(attrs)
    assert all(set(e) == {"asin", "instruction", "instruction_attributes", "instruction_options"} for e in entries)
    assert len({synthetic_asin(i, 0) for i in range(100_000)}) == 100_000


def test_generator_memory_does_not_grow_with_products(webshop_dir, tmp_path):
    peaks = {}
    for n in (300, 3000):
        tracemalloc.start()
        generate(tmp_path / f"n{n}", n, human_goals=50, src=webshop_dir)
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert (tmp_path / "n3000" / "items_shuffle.json").stat().st_size > 10 * 2**20
    assert peaks[3000] < peaks[300] + 2 * 2**20, peaks  # 10x the products, < 2 MiB more


def test_builder_scores_equal_bm25s_own_index(webshop_dir):
    products = list(iter_json_array(webshop_dir / "items_shuffle_prefix.json"))
    shop = Shop(ShopConfig(data_dir=str(webshop_dir), preload_nlp=False))
    texts = [document_text(p) for p in shop.catalog.products]
    builder = IndexBuilder(chunk_docs=7)  # many chunks: placement across chunks is exercised
    for t in texts:
        builder.add(t)
    arrays = builder.finish()
    ref = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    ref.index([analyze(t) for t in texts], show_progress=False)
    for query in ["wood console table", "men's shoes size 10", "tea tea", "zzz", "a the of"]:
        terms = [t for t in analyze(query) if t in ref.vocab_dict]
        expected = ref.get_scores(terms) if terms else np.zeros(len(texts), dtype=np.float32)
        got = np.zeros(len(texts), dtype=np.float32)
        for t in analyze(query):
            if t in arrays["vocab"]:
                k = arrays["vocab"][t]
                lo, hi = arrays["indptr"][k], arrays["indptr"][k + 1]
                np.add.at(got, arrays["indices"][lo:hi], arrays["data"][lo:hi])
        np.testing.assert_array_equal(got, expected)
    assert len(products) == len(texts) == 87


def test_disk_store_equals_in_memory_catalog(synth_dir, tmp_path):
    disk = Shop(ShopConfig(data_dir=str(synth_dir), cache_min_mb=0, cache_dir=str(tmp_path), preload_nlp=False))
    memory = Shop(ShopConfig(data_dir=str(synth_dir), use_cache=False, preload_nlp=False))
    assert disk.catalog.human_goals and memory.catalog.human_goals
    assert disk.goals == memory.goals and len(disk.goals) == 600
    assert disk.describe()["splits"] == {"train": 480, "eval": 60, "test": 60}
    assert dict(disk.catalog.prices) == memory.catalog.prices
    for asin, product in memory.catalog.by_asin.items():
        assert disk.catalog.by_asin[asin] == product
    assert disk.catalog.by_asin.get("B000000000") is None and "nope" not in disk.catalog.by_asin
    queries = [g["instruction_text"] for g in memory.goals[:40]] + ["red", "zzzz", "size 10 men"]
    for q in queries:
        assert disk.search(q) == memory.search(q)


def test_human_goals_of_products_outside_the_catalog_are_dropped(synth_dir, tmp_path):
    human = json.loads((synth_dir / "items_human_ins.json").read_text())
    products = json.loads((synth_dir / "items_shuffle.json").read_text())
    inside = {p["asin"] for p in products[:1000]}
    expected = sum(len(v) for k, v in human.items() if k in inside)
    shop = Shop(ShopConfig(data_dir=str(synth_dir), num_products=1000, cache_min_mb=0, cache_dir=str(tmp_path),
                           preload_nlp=False))
    assert len(shop.goals) == expected and 0 < expected < 600
    assert all(g["asin"] in inside for g in shop.goals)


def _store_dirs(cache):
    return sorted(p.name for p in cache.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_cache_is_keyed_by_content(synth_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for f in synth_dir.iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    cfg = ShopConfig(data_dir=str(data), cache_min_mb=0, cache_dir=str(tmp_path / "cache"), preload_nlp=False)
    first = Shop(cfg)
    assert len(_store_dirs(tmp_path / "cache")) == 1
    attrs = data / "items_ins_v2.json"
    st = attrs.stat()
    text = attrs.read_text()
    asin = first.goals[0]["asin"]
    old = json.dumps(first.catalog.by_asin[asin]["Attributes"][0])
    new = json.dumps("x" * (len(old) - 2))
    at = text.index(old, text.index(json.dumps(asin) + ": "))  # in this product's entry
    assert len(new) == len(old)
    attrs.write_text(text[:at] + new + text[at + len(old):])  # same size, and the mtime put back
    os.utime(attrs, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert attrs.stat().st_size == st.st_size and attrs.stat().st_mtime_ns == st.st_mtime_ns
    second = Shop(cfg)
    assert len(_store_dirs(tmp_path / "cache")) == 2  # never served from the stale cache
    assert second.catalog.by_asin[asin]["Attributes"][0] == json.loads(new)
    os.utime(attrs)  # touched, same bytes: served from the cache
    third = Shop(cfg)
    assert len(_store_dirs(tmp_path / "cache")) == 2
    assert third.catalog.by_asin[asin]["Attributes"] == second.catalog.by_asin[asin]["Attributes"]


_BUILD = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from envs.webshop_server.shop import Shop, ShopConfig
shop = Shop(ShopConfig(data_dir=sys.argv[1], cache_min_mb=0, cache_dir=sys.argv[2], preload_nlp=False))
print(json.dumps({"goals": len(shop.goals), "first": shop.search("wood table")[:5],
                  "folder": shop.catalog.products.folder.name}))
"""


def _builder(data, cache) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen([sys.executable, "-c", _BUILD, str(data), str(cache)], cwd=str(REPO_ROOT), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_servers_starting_at_once_share_one_cache(synth_dir, tmp_path):
    procs = [_builder(synth_dir, tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert results[0] == results[1] and results[0]["goals"] == 600
    assert _store_dirs(tmp_path) == [results[0]["folder"]]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.is_dir()]  # no half build left
    assert sum("building catalog cache" in err for _, err in outs) == 1  # the other one waited and reused it


def test_killed_build_leaves_no_half_cache(webshop_dir, tmp_path):
    generate(tmp_path / "data", 6000, human_goals=100, src=webshop_dir)
    proc = _builder(tmp_path / "data", tmp_path / "cache")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill it once records are being written, before it finishes
        if any((tmp_path / "cache").glob(".*/store/products.bin")):
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert _store_dirs(tmp_path / "cache") == []  # nothing that looks like a finished cache
    done = _builder(tmp_path / "data", tmp_path / "cache")
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    assert "removing unfinished cache build" in err
    assert len(_store_dirs(tmp_path / "cache")) == 1
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".") and p.is_dir()]


def test_search_index_rejects_a_mismatched_catalog(synth_dir, tmp_path):
    shop = Shop(ShopConfig(data_dir=str(synth_dir), cache_min_mb=0, cache_dir=str(tmp_path), preload_nlp=False))
    folder = shop.catalog.products.folder / "index"
    with pytest.raises(ValueError, match="index holds 2000 documents, catalog 3"):
        SearchIndex.load(folder, ["a", "b", "c"])


def test_background_builder_writes_the_same_store(synth_dir, tmp_path):
    import filecmp

    from envs.webshop_server.catalog import resolve_files
    from envs.webshop_server.store import build_store

    files = resolve_files(synth_dir, None)
    for background in (False, True):
        build_store(files, tmp_path / str(background), background_index=background)
    written = sorted(p.relative_to(tmp_path / "False") for p in (tmp_path / "False").rglob("*") if p.is_file())
    assert len(written) >= 14 and not list((tmp_path / "True").glob("chunk*.npz"))
    for rel in written:
        if rel.name != "meta.json":  # holds the seconds
            assert filecmp.cmp(tmp_path / "False" / rel, tmp_path / "True" / rel, shallow=False), rel


def _brute_force(index: SearchIndex, query: str, k: int) -> list[str]:
    scores = index.scores(query)
    hits = [i for i in range(len(scores)) if scores[i] > 0]
    return [index.asins[i] for i in sorted(hits, key=lambda i: (-scores[i], index.asins[i]))[:k]]


def test_pruned_top_k_equals_a_full_sort(webshop_dir, synth_dir):
    shop = Shop(ShopConfig(data_dir=str(synth_dir), use_cache=False, preload_nlp=False))
    queries = [g["instruction_text"] for g in shop.goals[:60]] + ["red", "size", "zzzz", "men women"]
    for k in (1, 7, 50):
        for q in queries:
            assert shop.index.search(q, k) == _brute_force(shop.index, q, k), (q, k)
    base = list(iter_json_array(webshop_dir / "items_shuffle_prefix.json"))[:3]
    twins = [dict(p, asin=f"Z{i:03d}{j}") for j in range(40) for i, p in enumerate(base)]  # ties everywhere
    from envs.webshop_server.catalog import normalise_product

    index = SearchIndex([normalise_product(p, None, None, {}) for p in twins])
    for q in ("console table", "the", "shoes table"):
        assert index.search(q, 50) == _brute_force(index, q, 50)


def test_episode_loop_on_a_store_backed_server(synth_dir, tmp_path):
    """The episode loop + scripted shopper through HTTP on a server serving from the disk store."""
    import requests

    from benchmarks.webshop import scripted_episodes
    from envs.webshop_server.process import WebShopServerProcess

    with WebShopServerProcess(data_dir=synth_dir, threads=8, extra_args=[
            "--cache-min-mb", "0", "--cache-dir", str(tmp_path)]) as srv:
        assert _store_dirs(tmp_path)  # served from the store, not from memory
        out = scripted_episodes(srv.url, 4, 2, max_steps=6)
        health = requests.get(f"{srv.url}/health").json()
    assert out["episodes"] == 8 and out["failed"] == 0 and out["bought"] == 8
    assert 0 < out["mean_score"] <= 1
    assert health["search_cache"]["hits"] >= 1  # rollouts of one task searched the same instruction


def test_worker_processes_share_the_store_and_route_sessions(synth_dir, tmp_path):
    """--workers 2: sessions live on their worker; a request reaching the other one is redirected;
    the client follows ``session_url``; stopping the server stops every worker."""
    import psutil
    import requests

    from benchmarks.webshop import scripted_episodes
    from envs.webshop_server.process import WebShopServerProcess

    with WebShopServerProcess(data_dir=synth_dir, threads=4, extra_args=[
            "--cache-min-mb", "0", "--cache-dir", str(tmp_path), "--workers", "2"]) as srv:
        parent = psutil.Process(srv.pid)
        workers = [p for p in parent.children() if p.cmdline() == parent.cmdline()]  # forks, not helpers
        assert len(workers) == 2
        seen, owners = set(), {}
        for k in range(400):  # new connections are spread over both workers by the kernel (unevenly under load)
            with requests.Session() as http:
                view = http.post(f"{srv.url}/api/sessions", json={"split": "train", "index": k % 40}).json()
            seen.add(view["session_url"])
            owners[view["session_id"]] = view["session_url"]
            if k >= 39 and len(seen) == 2:
                break
        assert len(seen) == 2 and all(sid.startswith(("w0.", "w1.")) for sid in owners)
        for sid, url in list(owners.items())[:10]:
            r = requests.post(f"{srv.url}/api/sessions/{sid}/step", json={"action": "search[tea]"},
                              allow_redirects=False)
            assert r.status_code in (200, 307)
            if r.status_code == 307:  # reached the other worker: sent to the owner
                assert r.headers["Location"] == f"{url}/api/sessions/{sid}/step"
            r = requests.post(f"{url}/api/sessions/{sid}/step", json={"action": "click[back to search]"})
            assert r.status_code == 200 and r.json()["steps"] >= 1
        sid, url = next(iter(owners.items()))
        other = next(u for u in seen if u != url)
        r = requests.get(f"{other}/api/sessions/{sid}?mode=text", allow_redirects=False)
        assert r.status_code == 307 and r.headers["Location"] == f"{url}/api/sessions/{sid}?mode=text"
        assert requests.get(f"{other}/api/sessions/{sid}").json()["session_id"] == sid  # followed
        assert requests.delete(f"{other}/api/sessions/{sid}").json() == {"closed": True}
        out = scripted_episodes(srv.url, 4, 2, max_steps=6)  # WebShopEnv follows session_url
        assert out["failed"] == 0 and out["bought"] == 8
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)


def test_full_products_file_pairs_with_the_full_attributes_file(synth_dir, webshop_dir, tmp_path):
    from envs.webshop_server.catalog import resolve_files

    for f in synth_dir.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "items_ins_v2_1000.json").symlink_to(webshop_dir / "items_ins_v2_1000.json")
    (tmp_path / "items_shuffle_prefix.json").symlink_to(webshop_dir / "items_shuffle_prefix.json")
    assert resolve_files(tmp_path, "items_shuffle.json")["attributes"].name == "items_ins_v2.json"
    assert resolve_files(tmp_path, "items_shuffle_prefix.json")["attributes"].name == "items_ins_v2_1000.json"
