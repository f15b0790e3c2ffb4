"""A person's path in a real headless Chromium: search page -> search -> item -> option -> buy -> score."""

from __future__ import annotations

import shutil

import pytest
import requests

selenium = pytest.importorskip("selenium")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from progpo_tests.patience import PATIENCE_S  # noqa: E402

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def driver():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail("headless browser test needs Debian packages chromium and chromium-driver "
                    "(apt-get install -y chromium chromium-driver; .ci/run installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver), options=opts)
    drv.set_page_load_timeout(PATIENCE_S)
    try:
        yield drv
    finally:
        drv.quit()


def test_person_buys_in_browser(server, shop, driver):
    goal_index = shop.splits.goal_index("test", 0)
    goal = shop.goals[goal_index]
    product = shop.catalog.by_asin[goal["asin"]]
    wait = WebDriverWait(driver, PATIENCE_S)

    driver.get(f"{server.url}/?split=test&index=0")
    box = wait.until(EC.presence_of_element_located((By.ID, "search_input")))
    assert goal["instruction_text"] in driver.find_element(By.ID, "instruction-text").text
    box.send_keys(goal["name"].lower()[:80])
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    link = wait.until(EC.presence_of_element_located((By.LINK_TEXT, goal["asin"])))
    assert "/search_results/" in driver.current_url
    link.click()

    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "button.purchase")))
    assert product["Title"] in driver.page_source or driver.find_element(By.TAG_NAME, "h2").text
    chosen = {}
    for name, value in goal["goal_options"].items():
        radios = [r for r in driver.find_elements(By.CSS_SELECTOR, f'input[type="radio"][name="{name}"]')
                  if r.get_attribute("value") == value]
        assert radios, (name, value)
        radios[0].click()
        wait.until(lambda d, n=name, v=value: any(
            r.get_attribute("value") == v and r.is_selected()
            for r in d.find_elements(By.CSS_SELECTOR, f'input[type="radio"][name="{n}"]')))
        chosen[name] = value
    driver.find_element(By.CSS_SELECTOR, "button.purchase").click()

    score = wait.until(EC.presence_of_element_located((By.ID, "reward")))
    assert "/done/" in driver.current_url
    assert "Thank you for shopping with us!" in driver.page_source
    assert "Your score (min 0.0, max 1.0)" in score.text
    sid = driver.current_url.split("/done/")[1].split("/")[0]
    view = requests.get(f"{server.url}/api/sessions/{sid}").json()
    assert view["done"] and view["purchase"]["asin"] == goal["asin"] and view["purchase"]["options"] == chosen
    assert f"{view['reward']}" in score.text
