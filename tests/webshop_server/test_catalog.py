"""Catalog streaming, prices and goal splits."""

from __future__ import annotations

import json

import pytest

from envs.webshop_server.catalog import iter_json_array, load_catalog
from envs.webshop_server.goals import make_splits
from envs.webshop_server.shop import Shop, ShopConfig


def test_streaming_parser_equals_json_load(webshop_dir, tmp_path):
    path = webshop_dir / "items_shuffle_prefix.json"
    with open(path) as f:
        whole = json.load(f)
    assert list(iter_json_array(path, chunk_chars=1000)) == whole
    bad = tmp_path / "bad.json"
    bad.write_text('[{"a": 1}, {"b": ')
    with pytest.raises(ValueError, match="truncated"):
        list(iter_json_array(bad, chunk_chars=8))
    notarray = tmp_path / "obj.json"
    notarray.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="JSON array"):
        list(iter_json_array(notarray))


def test_prices_fixed_and_in_range(webshop_dir):
    a, _ = load_catalog(webshop_dir)
    b, _ = load_catalog(webshop_dir)
    assert a.prices == b.prices
    for p in a.products:
        lo, hi = p["pricing"][0], p["pricing"][-1]
        assert lo <= a.prices[p["asin"]] <= hi


def test_goal_order_identical_across_loads(webshop_dir):
    s1 = Shop(ShopConfig(data_dir=str(webshop_dir)))
    s2 = Shop(ShopConfig(data_dir=str(webshop_dir)))
    assert [g["instruction_text"] for g in s1.goals] == [g["instruction_text"] for g in s2.goals]
    assert len(s1.goals) == 489
    assert s1.splits.mode == "proportional"
    assert {k: s1.splits.size(k) for k in ("test", "eval", "train")} == {"test": 48, "eval": 48, "train": 393}


def test_split_rules():
    std = make_splits(12087)
    assert std.mode == "standard" and std.range("test") == (0, 500) and std.range("eval") == (500, 1500)
    assert std.range("train") == (1500, 12087)
    assert std.goal_index("train", 0) == 1500
    with pytest.raises(ValueError, match="out of range"):
        std.goal_index("test", 500)
    with pytest.raises(ValueError, match="unknown split"):
        std.size("valid")
    with pytest.raises(ValueError, match="more than 1500"):
        make_splits(1000, "standard")


def test_bad_config_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="session_ttl_s"):
        ShopConfig(session_ttl_s=0)
    with pytest.raises(FileNotFoundError, match="products file"):
        load_catalog(tmp_path)
    with pytest.raises(ValueError, match="goal_source"):
        load_catalog(tmp_path, goal_source="robot")


def test_disk_cache_gives_identical_shop(webshop_dir, tmp_path):
    from envs.webshop_server.synth import generate

    generate(tmp_path / "data", 300, human_goals=0, src=webshop_dir)
    (tmp_path / "data" / "items_human_ins.json").unlink()
    cfg = ShopConfig(data_dir=str(tmp_path / "data"), cache_min_mb=0, cache_dir=str(tmp_path / "cache"))
    cold = Shop(cfg)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [cold.catalog.products.folder.name]
    warm = Shop(cfg)
    memory = Shop(ShopConfig(data_dir=str(tmp_path / "data"), use_cache=False))
    for query in ["red shirt for men", "tea", "wig", "nothing-at-all"]:
        assert cold.search(query) == warm.search(query) == memory.search(query)
    assert [g["instruction_text"] for g in cold.goals] == [g["instruction_text"] for g in warm.goals] \
        == [g["instruction_text"] for g in memory.goals]
    assert cold.catalog.prices == warm.catalog.prices == memory.catalog.prices
    assert len(cold.catalog.products) == 300 and not cold.catalog.human_goals


def test_idle_sessions_expire_and_cap(webshop_dir, monkeypatch):
    import envs.webshop_server.shop as shop_mod
    from envs.webshop_server.shop import ShopFull

    now = [1000.0]
    monkeypatch.setattr(shop_mod.time, "monotonic", lambda: now[0])
    shop = Shop(ShopConfig(data_dir=str(webshop_dir), session_ttl_s=60, max_sessions=2))
    a = shop.create_session(0)
    a.last_used = now[0]
    now[0] += 30
    assert shop.get_session(a.sid) is a  # touched: idle clock restarts
    b = shop.create_session(1)
    b.last_used = now[0]
    with pytest.raises(ShopFull):
        shop.create_session(2)
    now[0] += 61
    assert shop.get_session(a.sid) is None  # expired
    c = shop.create_session(3)  # creating sweeps the other expired session too
    assert shop.describe()["sessions"] == 1 and shop.get_session(c.sid) is not None
    assert len({a.sid, b.sid, c.sid}) == 3


def test_human_goals_when_file_present(webshop_dir, tmp_path):
    """items_human_ins.json switches to human goals (original get_human_goals rules)."""
    from envs.webshop_server.reward import get_reward

    data = tmp_path / "data"
    data.mkdir()
    for name in ("items_shuffle_prefix.json", "items_ins_v2_1000.json"):
        (data / name).symlink_to(webshop_dir / name)
    products = json.loads((webshop_dir / "items_shuffle_prefix.json").read_text())
    human = {p["asin"]: [{"instruction": f"i want {p['query']}.", "instruction_attributes": ["easy to use"],
                          "instruction_options": ["black"]},
                         {"instruction": "skipped: no attributes", "instruction_attributes": [],
                          "instruction_options": []}]
             for p in products[:30]}
    (data / "items_human_ins.json").write_text(json.dumps(human))
    shop = Shop(ShopConfig(data_dir=str(data)))
    assert shop.catalog.human_goals and len(shop.goals) == 30
    goal = shop.goals[0]
    assert goal["weight"] == 1 and goal["goal_options"] == ["black"]
    assert goal["instruction_text"].startswith("i want ") and "." not in goal["instruction_text"][-1]
    product = shop.catalog.by_asin[goal["asin"]]
    total, info = get_reward(product, goal, shop.catalog.prices[goal["asin"]], {"color": "black"})
    assert 0.0 <= total <= 1.0 and info["r_option"] == 1.0
    with pytest.raises(FileNotFoundError, match="items_human_ins"):
        load_catalog(webshop_dir, goal_source="human")
