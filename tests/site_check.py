"""What a reader sees of a built page, measured in headless Chromium: for every table of the page,
its columns' headers and whether each column's right edge lies inside the visible width of the
table's box (the page at a given window width, before any sideways scrolling).

`layout(page, width)` copies the page beside itself with a measuring script appended, lets
Chromium lay it out (`--dump-dom`) and reads the script's JSON back. `chromium()` is the browser
found on PATH, or None (.ci/run installs it; tests/test_site.py says when it is missing)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

# For each table: the box it scrolls in (Material wraps tables in .md-typeset__scrollwrap), the
# headers of its first row, and per column whether its right edge is inside the box.
_MEASURE = """
<script>
window.addEventListener("load", () => {
  const out = [];
  for (const table of document.querySelectorAll("article table")) {
    const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
    const right = Math.min(box.getBoundingClientRect().right, document.documentElement.clientWidth);
    const head = table.querySelector("tr");
    const cells = head ? Array.from(head.children) : [];
    out.push({headers: cells.map(c => c.textContent.trim()),
              visible: cells.map(c => c.getBoundingClientRect().right <= right + 1)});
  }
  const pre = document.createElement("pre");
  pre.id = "site-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def layout(page: Path, width: int = 1400, browser: str | None = None) -> list[dict]:
    """Per table of the built `page` (an index.html of the site): {"headers", "visible"}."""
    browser = browser or chromium()
    if browser is None:
        raise RuntimeError("no Chromium on PATH")
    probe = page.with_name("site-check.html")
    probe.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
    try:
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--window-size={width},1000", "--virtual-time-budget=5000", "--dump-dom",
                               probe.as_uri()], capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    found = re.search(r'<pre id="site-check">(.*?)</pre>', done.stdout, re.S)
    if found is None:
        raise RuntimeError(f"Chromium gave no measurement for {page}: {done.stderr[-500:]}")
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))


def hidden_columns(tables: list[dict], wanted: tuple[str, ...]) -> list[str]:
    """The headers among `wanted` that some table shows only after scrolling sideways."""
    return sorted({h for t in tables for h, seen in zip(t["headers"], t["visible"]) if h in wanted and not seen})
