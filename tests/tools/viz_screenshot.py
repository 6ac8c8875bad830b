"""A headless-browser look at ``ge viz``'s page: ``python -m tests.tools.viz_screenshot OUT_DIR``
draws onnx's light_resnet50 (415 nodes) and the 2,000-node chain of tests/tools/test_viz.py as
HTML, has headless Chromium (Debian's ``chromium`` package, ``/usr/bin/chromium``) take a
1280x900 screenshot of each page as it opens (the script's fit view), and checks each PNG: the
drawing area is not blank and holds dark (text and border) pixels in several separate rows, that
is boxes with readable labels rather than a strip of specks. Exit status 0 when both pass.

Not a pytest test: CI's machine has no browser (``.ci/run`` installs none), and the layout
itself is checked there without one (tests/tools/test_viz.py: sizes, no overlapping boxes,
shapes on the edges). Look at the PNGs with any image viewer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def screenshot(browser: str, page: str, png: str, size: tuple[int, int] = (1280, 900)) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                        f"--screenshot={png}", "file://" + os.path.abspath(page)],
                       check=True, capture_output=True, timeout=120)


def check(png: str) -> str | None:
    """None when the drawing area shows boxes with labels, else what is wrong."""
    from PIL import Image

    img = Image.open(png).convert("L")
    w, h = img.size
    area = img.crop((20, 180, w - 40, h - 10))  # below the page's header and search bar
    px = area.load()
    aw, ah = area.size
    dark_rows = [y for y in range(ah) if sum(1 for x in range(0, aw, 2) if px[x, y] < 100) >= 3]
    if not dark_rows:
        return "the drawing area is blank"
    bands, last = 0, -10
    for y in dark_rows:
        if y > last + 8:
            bands += 1
        last = y
    if bands < 4:
        return f"only {bands} band(s) of text/borders: no readable boxes in the fit view"
    return None


def main(out: str) -> int:
    import ge_core as ge
    from ge_sdk.viz import render
    from tests.conftest import light_model_path
    from tests.tools.test_viz import _big

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("error: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    pages = {"light_resnet50": ge.load(light_model_path("resnet50")),
             "chain_2000": ge.load(_big(os.path.join(out, "chain_2000.onnx")))}
    bad = 0
    for name, graph in pages.items():
        page, png = os.path.join(out, f"{name}.html"), os.path.join(out, f"{name}.png")
        render(graph, page)
        screenshot(browser, page, png)
        why = check(png)
        print(f"{png}: {len(graph)} nodes: {'ok' if why is None else why}")
        bad += why is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "viz_screenshots"))
