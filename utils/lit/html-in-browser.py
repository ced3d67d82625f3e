#!/usr/bin/env python3
"""Opens an HTML report in headless Chromium and prints what a person sees.

    html-in-browser.py REPORT.html SCREENSHOT.png

Chromium (Debian's chromium-headless-shell) is driven over the DevTools
protocol on a pipe (--remote-debugging-pipe: no port, no network). The page
is loaded from its file, laid out at 1200 pixels wide, and read back as
rendered: the verdict, the first suspect, the curve's size on screen, the
suspects marked on it, each finding's evidence table and source, every
request the page made and every script it ran. The screenshot is written,
and its pixels are checked for the curve's colour: a curve the browser did
not draw is not seen by a person either.

Standard library only; prints one fact per line for FileCheck.
"""
import base64
import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from urllib.parse import unquote

CURVE_RGB = (0x00, 0x66, 0xCC)  # Html.cpp's curve, #06c (its points are #039)


def chromium():
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        path = shutil.which(name) or (
            "/usr/lib/chromium/" + name if os.path.exists("/usr/lib/chromium/" + name) else None)
        if path:
            return path
    sys.exit("html-in-browser: no headless Chromium (apt install chromium-headless-shell)")


class DevTools:
    """The DevTools protocol over Chromium's pipe: JSON messages ended by NUL."""

    def __init__(self, argv):
        # Chromium reads commands on fd 3 and writes replies on fd 4.
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Above 4 first, so that the dup2 onto 3 and 4 cannot clobber them.
        hi_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)

        def child_fds():
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        # Not with a sanitized build's preloaded ASan (test/lit.cfg.py):
        # Chromium, with allocators of its own, hangs under it, and it runs
        # none of Ekka's code.
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen(argv, preexec_fn=child_fds, close_fds=False, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (to_chrome_r, from_chrome_w, hi_r, hi_w):
            os.close(fd)
        self.buffer, self.next_id, self.events = b"", 0, []

    def _read_message(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, session=None, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method):
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read_message()
            if event.get("method") == method:
                return event
            self.events.append(event)

    def close(self):
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# What a person sees, read off the laid-out page.
SEEN = r"""
(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const shown = e => { const [w, h] = box(e); return w > 0 && h > 0 &&
                        getComputedStyle(e).visibility !== 'hidden'; };
  const text = sel => { const e = document.querySelector(sel); return e && shown(e) ?
                        e.innerText.trim() : null; };
  const svg = document.querySelector('svg#error-ratio');
  const curve = svg && svg.querySelector('polyline.curve');
  return {
    title: document.title,
    verdict: text('h1'),
    first: text('p.first'),
    scripts: document.scripts.length,
    svg: svg ? box(svg) : null,
    curve: curve ? {points: curve.points.numberOfItems, box: box(curve)} : null,
    axis_labels: svg ? [...svg.querySelectorAll('text.axis-label')].map(e => e.textContent) : [],
    threshold: svg ? [...svg.querySelectorAll('text.threshold')].map(e => e.textContent) : [],
    marks: svg ? [...svg.querySelectorAll('text.mark')].filter(shown).map(e => e.textContent) : [],
    circled: svg ? svg.querySelectorAll('circle.suspect-mark').length : 0,
    findings: [...document.querySelectorAll('section.finding')].map(s => ({
      heading: s.querySelector('h2').innerText,
      reason: s.querySelector('p.reason') ? s.querySelector('p.reason').innerText : '',
      header: [...s.querySelectorAll('table.evidence thead th')].map(e => e.innerText),
      rows: s.querySelectorAll('table.evidence tbody tr').length,
      suspect_row: [...s.querySelectorAll('table.evidence tr.suspect td')].map(e => e.innerText),
      suspect_row_bold: s.querySelector('tr.suspect td') ?
        getComputedStyle(s.querySelector('tr.suspect td')).fontWeight : '',
      where: s.querySelector('p.where') ? s.querySelector('p.where').innerText : '',
      source: s.querySelector('pre.source') && shown(s.querySelector('pre.source')) ?
        s.querySelector('pre.source').innerText.split('\n')[0] : '',
    })),
  };
})()
"""


def png_pixels(png):
    """The RGB(A) rows of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", data[:10])
            assert depth == 8 and colour in (2, 6), "unexpected PNG format"
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], None
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i] if prev else 0
            c = prev[i - channels] if prev and i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    report, screenshot = os.path.abspath(sys.argv[1]), sys.argv[2]
    profile = screenshot + ".profile"
    shutil.rmtree(profile, ignore_errors=True)
    tools = DevTools([chromium(), "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                      "--no-first-run", "--user-data-dir=" + profile,
                      "--hide-scrollbars", "--force-device-scale-factor=1", "about:blank"])
    try:
        target = tools.call("Target.createTarget", url="about:blank")["targetId"]
        session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            tools.call(domain + ".enable", session)
        tools.call("Emulation.setDeviceMetricsOverride", session, width=1200, height=900,
                   deviceScaleFactor=1, mobile=False)
        tools.call("Page.navigate", session, url="file://" + report)
        tools.wait_for("Page.loadEventFired")
        seen = tools.call("Runtime.evaluate", session, expression=SEEN,
                          returnByValue=True)["result"]["value"]
        requests = [e["params"]["request"]["url"] for e in tools.events
                    if e.get("method") == "Network.requestWillBeSent"]
        # The first screen, as a person opening the report sees it.
        shot = tools.call("Page.captureScreenshot", session, format="png")["data"]
    finally:
        tools.close()
        shutil.rmtree(profile, ignore_errors=True)
    png = base64.b64decode(shot)
    with open(screenshot, "wb") as f:
        f.write(png)

    print("title:", seen["title"])
    print("verdict:", seen["verdict"])
    print("first:", seen["first"])
    # The page's own file is its one request; anything else went out.
    page = "file://" + report
    print("requests beyond the page:", len([u for u in requests if unquote(u) != page]))
    print("scripts:", seen["scripts"])
    if seen["svg"]:
        print("plot: %dx%d" % tuple(seen["svg"]))
    if seen["curve"]:
        print("curve: %d points, %dx%d on screen" % (seen["curve"]["points"],
                                                     *seen["curve"]["box"]))
    for label in seen["axis_labels"]:
        print("axis:", label)
    for label in seen["threshold"]:
        print("threshold line:", label)
    print("suspects circled:", seen["circled"])
    for mark in seen["marks"]:
        print("mark:", mark)
    for f in seen["findings"]:
        print("finding:", f["heading"])
        print("  reason:", f["reason"])
        print("  evidence: %s, %d rows; suspect row %s, weight %s" % (
            " | ".join(f["header"]), f["rows"], " | ".join(f["suspect_row"]),
            f["suspect_row_bold"]))
        print("  where:", f["where"])
        print("  source:", f["source"])
    width, height, channels, rows = png_pixels(png)
    curve_pixels = sum(
        1 for row in rows for x in range(0, width * channels, channels)
        if all(abs(row[x + k] - CURVE_RGB[k]) <= 8 for k in range(3)))
    print("screenshot: %dx%d, curve colour drawn: %s" % (width, height,
                                                          "yes" if curve_pixels > 200 else "no"))


if __name__ == "__main__":
    main()
