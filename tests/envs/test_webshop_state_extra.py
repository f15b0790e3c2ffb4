"""WebShop's ``info["state_extra"]``: the options chosen on the current item, read from the page URL."""

import pytest

from progpo.envs.webshop import options_text, selected_options


@pytest.mark.parametrize("url, want", [
    ("/item_page/abc/B0123/%5B%27red%27%2C%20%27shirt%27%5D/1/%7B%27color%27%3A%20%27black%20%2F%20white%27%7D",
     {"color": "black / white"}),
    ("/item_sub_page/abc/B0123/%5B%27x%27%5D/2/Description/%7B%27size%27%3A%20%27large%27%2C%20%27color%27%3A%20%27red%27%7D",
     {"size": "large", "color": "red"}),
    ("/done/abc/B0123/%7B%7D", {}),
    ("/item_page/abc/B0123/%5B%27x%27%5D/1/%7B%7D", {}),
    ("/search_results/abc/%5B%27x%27%5D/1", {}),
    ("/abc", {}),
    ("/item_page/abc/B0123/x/1/not-a-dict", {}),
    ("/item_page/abc/B0123/x/1/%5B1%2C2%5D", {}),  # a list, not a dict
    ("", {}),
])
def test_selected_options_from_the_url(url, want):
    assert selected_options(url) == want


def test_options_text_ignores_the_click_order():
    assert options_text({}) == "Selected options: none."
    a = options_text({"size": "large", "color": "red"})
    assert a == options_text({"color": "red", "size": "large"}) == "Selected options: color: red, size: large."


def test_selected_options_of_the_servers_own_urls():
    from envs.webshop_server.engine import PageState, Urls

    opts = {"color": "black | white", "size": "x-large (us 12/14)"}
    for state in (PageState("item_page", ["red", "shirt/tee"], 3, "B0123", opts),
                  PageState("item_sub_page", ["x"], 1, "B0123", opts, "Features"),
                  PageState("done", ["x"], 1, "B0123", opts)):
        assert selected_options(Urls("s1d", state).current) == opts
    assert selected_options(Urls("s1d", PageState("search_results", ["x"], 2)).current) == {}
    assert selected_options(Urls("s1d", PageState()).current) == {}
