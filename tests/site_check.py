"""What a reader sees of a built page, measured in headless Chromium: for every table of the page,
its columns' headers, whether each column's right edge lies inside the visible width of the
table's box (the page at a given window width, before any sideways scrolling), how wide the table
is against the page's content area, where it starts, how tall its rows are, and whether a caption
paragraph stands right above it.

`layout(page, width)` copies the page beside itself with a measuring script appended, lets
Chromium lay it out (`--dump-dom`) and reads the script's JSON back; `layouts(pages, width)` does
it for several pages in one browser start (each page in its own frame of a probe page).
`chromium()` is the browser found on PATH, or None (.ci/run installs it; tests/test_site.py says
when it is missing)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

# For each table of the article: the box it scrolls in (Material wraps tables in
# .md-typeset__scrollwrap), the headers of its first row, per column whether its right edge is
# inside the box, the table's width and the content area's (the article's width inside its
# padding), the table's top (px from the top of the page), its body rows' heights, and whether the
# element right before its wrapper is a paragraph (a caption above it).
_MEASURE = """
<script>
function measure(doc, win) {
  const out = [];
  const article = doc.querySelector("article");
  if (!article) return out;
  const style = win.getComputedStyle(article);
  const area = article.getBoundingClientRect();
  const left = area.left + parseFloat(style.paddingLeft), right = area.right - parseFloat(style.paddingRight);
  for (const table of article.querySelectorAll("table")) {
    const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
    const shown = Math.min(box.getBoundingClientRect().right, doc.documentElement.clientWidth);
    const head = table.querySelector("tr");
    const cells = head ? Array.from(head.children) : [];
    const rect = table.getBoundingClientRect();
    const before = (table.closest(".md-typeset__scrollwrap") || table).previousElementSibling;
    out.push({headers: cells.map(c => c.textContent.trim()),
              visible: cells.map(c => c.getBoundingClientRect().right <= shown + 1),
              width: Math.round(table.scrollWidth), area: Math.round(right - left),
              overflow: Math.round(Math.max(rect.right, rect.left + table.scrollWidth) - right),
              top: Math.round(rect.top + win.scrollY),
              rows: Array.from(table.querySelectorAll("tbody tr"), r => Math.round(r.getBoundingClientRect().height)),
              caption_above: Boolean(before && before.tagName === "P"),
              in_details: Boolean(table.closest("details"))});
  }
  return out;
}
function report(result) {
  const pre = document.createElement("pre");
  pre.id = "site-check";
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
}
window.addEventListener("load", () => {
  const frames = Array.from(document.querySelectorAll("iframe.site-check"));
  if (!frames.length) { report(measure(document, window)); return; }
  // the probe of several pages: every frame as wide as the window and tall enough to hold its page
  report(frames.map(f => {
    for (const d of f.contentDocument.querySelectorAll("details")) d.open = true;
    return measure(f.contentDocument, f.contentWindow);
  }));
});
</script>
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _dump(probe: Path, width: int, browser: str | None) -> object:
    browser = browser or chromium()
    if browser is None:
        raise RuntimeError("no Chromium on PATH")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--allow-file-access-from-files", f"--window-size={width},1000",
                           "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=300)
    found = re.search(r'<pre id="site-check">(.*?)</pre>', done.stdout, re.S)
    if found is None:
        raise RuntimeError(f"Chromium gave no measurement for {probe}: {done.stderr[-500:]}")
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))


def layout(page: Path, width: int = 1400, browser: str | None = None) -> list[dict]:
    """Per table of the built `page` (an index.html of the site), as the module docstring says."""
    probe = page.with_name("site-check.html")
    probe.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
    try:
        return _dump(probe, width, browser)
    finally:
        probe.unlink()


def layouts(site: Path, pages: list[Path], width: int = 1400, browser: str | None = None) -> dict[Path, list[dict]]:
    """`layout` of several built pages of the site folder `site` in one browser start: each page in
    a frame of the window's width and 40000 px tall (taller than any page of the site, so that
    nothing scrolls inside a frame), its <details> opened."""
    frames = "".join(f'<iframe class="site-check" src="{p.relative_to(site).as_posix()}" '
                     f'style="display:block;border:0;width:{width}px;height:40000px"></iframe>' for p in pages)
    probe = site / "site-check.html"
    probe.write_text(f"<!doctype html><html><body style='margin:0'>{frames}{_MEASURE}</body></html>")
    try:
        return dict(zip(pages, _dump(probe, width, browser)))
    finally:
        probe.unlink()


def hidden_columns(tables: list[dict], wanted: tuple[str, ...]) -> list[str]:
    """The headers among `wanted` that some table shows only after scrolling sideways."""
    return sorted({h for t in tables for h, seen in zip(t["headers"], t["visible"]) if h in wanted and not seen})


def too_wide(tables: list[dict], slack: int = 1) -> list[dict]:
    """The tables wider than the page's content area (by more than `slack` px)."""
    return [t for t in tables if t["overflow"] > slack or t["width"] > t["area"] + slack]
