"""The live page end to end in headless Chromium (Debian `chromium` + `chromium-driver`,
driven by Selenium): send a prompt, see paced tokens appear, see the charts fed."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from andante.server.toy import TOY_TEXT
from tests.server.helpers import toy_server

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")

webdriver = pytest.importorskip("selenium.webdriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                       reason="needs Debian chromium and chromium-driver "
                       "(scripts/bootstrap-test.sh)"),
]


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="andante-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_chat_box_streams_a_paced_answer(browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    with toy_server(toy_step_time=0.005) as srv:
        driver.get(srv.url + "/")  # type: ignore[attr-defined]
        wait = WebDriverWait(driver, 20)
        wait.until(lambda d: "toy" in d.find_element(By.ID, "model").text)
        prompt = driver.find_element(By.ID, "prompt")  # type: ignore[attr-defined]
        prompt.clear()
        prompt.send_keys("Tell me about foxes")
        driver.execute_script(  # type: ignore[attr-defined]
            "document.getElementById('tds').value = '40';"
            "document.getElementById('maxtok').value = '20';")
        driver.find_element(By.ID, "send").click()  # type: ignore[attr-defined]
        output = driver.find_element(By.ID, "output")  # type: ignore[attr-defined]
        wait.until(lambda d: len(output.text) > 0)  # the first tokens appear...
        partial = output.text
        answer = TOY_TEXT[:20].strip()
        wait.until(lambda d: output.text.strip() == answer, f"never showed {answer!r}")
        assert len(partial) < 20  # paced: it was not all there at once
        status = driver.find_element(By.ID, "status")  # type: ignore[attr-defined]
        wait.until(lambda d: status.text.startswith("done"), "never done")
        wait.until(lambda d: "finished: 1" in d.find_element(By.ID, "health").text)
        drawn = driver.execute_script(  # type: ignore[attr-defined]
            "const c = document.getElementById('c-qoe').getContext('2d');"
            "const px = c.getImageData(0, 0, c.canvas.width, c.canvas.height).data;"
            "let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i]) n++; return n;")
        assert drawn > 0
