"""A real headless Chromium (Debian's chromium and chromedriver, driven by Selenium), to look at the report the way a
person does. Installs the two Debian packages when they are missing and this runs as root with apt-get (README,
"Test it"); elsewhere the tests that need it skip, saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PACKAGES = ["chromium", "chromium-driver"]


def install_chromium() -> str | None:
    """None when Chromium and its driver are there (installing them if it may); else why they are not."""
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "Chromium is not installed and this user cannot install it (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        result = subprocess.run(install, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            return f"apt-get could not install {' '.join(PACKAGES)}: {result.stderr[-500:]}"
    return None


def headless_chromium() -> Any:
    """A Selenium driver of Debian's headless Chromium, with no network of its own (this machine has none)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(condition: Any, timeout: float = 20.0) -> Any:
    """`condition()`'s first truthy value, polled until `timeout` seconds; AssertionError after."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not seen within {timeout} s")
