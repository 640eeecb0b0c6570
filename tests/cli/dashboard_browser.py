#!/usr/bin/env python3
"""Loads a troupe dashboard in a headless browser (standard library only): Chromium over the
DevTools protocol, Firefox over WebDriver BiDi (built into Firefox: no driver program).

    dashboard_browser.py BROWSER URL TOKEN EXPECTED_TEXT [SCREENSHOT.png]
    dashboard_browser.py BROWSER --timeline URL [SCREENSHOT.png]


BROWSER is the path of chromium or of firefox / firefox-esr (told apart by its name). Signs in
through the dashboard's login page with TOKEN (the form and its cookie, as a person would), waits
for the node list and for a live update (a state version newer than the first one the page
showed), checks that EXPECTED_TEXT is on the page as text, that no element came out of it (no
<img src=x>), that the session cookie is not readable by script and that no dialog opened (a
hostile name that ran script would alert), and takes a screenshot (checked to be a PNG; written
to SCREENSHOT.png when given). Prints "dashboard_browser: ok (BROWSER VERSION)" or exits 1
saying why.

With --timeline, URL is the dashboard of a pipelined `troupe train` (no token): it waits for the
drawing of the last measured step to show (an image that loaded) and for a newer one to replace
it, checks that no dialog opened and takes a screenshot of it (written to SCREENSHOT.png when given).
"""
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request


def fail(why):
    print("dashboard_browser: FAIL: " + why, file=sys.stderr)
    sys.exit(1)


class DevTools:
    """A minimal WebSocket client (RFC 6455, text frames) speaking the DevTools protocol."""

    def __init__(self, url):
        rest = url[len("ws://"):]
        hostport, path = rest.split("/", 1)
        host, port = hostport.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            fail("DevTools refused the WebSocket: " + head.decode(errors="replace"))
        self.next_id = 0
        self.events = []

    def _recv(self):
        data = self.sock.recv(65536)
        if not data:
            fail("DevTools closed the connection")
        return data

    def _take(self, n):
        while len(self.buf) < n:
            self.buf += self._recv()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, text):
        data = text.encode()
        head = bytes([0x81])
        if len(data) < 126:
            head += bytes([0x80 | len(data)])
        elif len(data) < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", len(data))
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", len(data))
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _message(self):
        payload = b""
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._take(8))[0]
            mask = self._take(4) if b1 & 0x80 else None
            data = self._take(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if b0 & 0x0F == 0x8:
                fail("DevTools closed the WebSocket")
            if b0 & 0x0F in (0x9, 0xA):  # ping, pong
                continue
            payload += data
            if b0 & 0x80:
                return json.loads(payload)

    # Both protocols frame a command as {"id", "method", "params"} and answer with its id.
    def call(self, method, tolerate=False, **params):
        """The command's result; an error fails the test, or gives None when `tolerate`."""
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            m = self._message()
            if m.get("id") == self.next_id:
                if "error" in m:
                    if tolerate:
                        return None
                    fail(f"{method}: {m['error']} {m.get('message', '')}")
                return m.get("result", {})
            self.events.append(m)
            if m.get("method") in DIALOG_EVENTS:
                fail("a dialog opened: " + json.dumps(m.get("params")))


# A page that opened an alert, confirm or prompt: Chromium's and WebDriver BiDi's events.
DIALOG_EVENTS = ("Page.javascriptDialogOpening", "browsingContext.userPromptOpened")


class Chromium:
    """Headless Chromium driven over the DevTools protocol."""

    def __init__(self, binary, profile):
        self.process = subprocess.Popen([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                         "--remote-debugging-port=0", "--user-data-dir=" + profile,
                                         "--window-size=1100,640", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(profile, "DevToolsActivePort")
        wait_for_file(port_file, "Chromium did not open its DevTools port")
        port = open(port_file).read().split()[0]
        version = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version"))
        self.name = version.get("Browser", "Chromium")
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(p for p in pages if p["type"] == "page")
        self.dt = DevTools(page["webSocketDebuggerUrl"])
        self.dt.call("Page.enable")
        self.dt.call("Runtime.enable")

    def navigate(self, url):
        self.dt.call("Page.navigate", url=url)

    def evaluate(self, expression):
        r = self.dt.call("Runtime.evaluate", tolerate=True, expression=expression, returnByValue=True)
        return (r or {}).get("result", {}).get("value")

    def screenshot(self):
        return base64.b64decode(self.dt.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])


class Firefox:
    """Headless Firefox driven over WebDriver BiDi, which Firefox serves itself when started with
    --remote-debugging-port (it writes the port to WebDriverBiDiServer.json in its profile)."""

    def __init__(self, binary, profile):
        self.process = subprocess.Popen([binary, "--headless", "--no-remote", "--profile", profile,
                                         "--remote-debugging-port", "0", "--window-size", "1100,640", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(profile, "WebDriverBiDiServer.json")
        wait_for_file(port_file, "Firefox did not open its WebDriver BiDi port")
        port = json.load(open(port_file))["ws_port"]
        self.dt = DevTools(f"ws://127.0.0.1:{port}/session")
        caps = self.dt.call("session.new", capabilities={})["capabilities"]
        self.name = f"{caps.get('browserName', 'firefox')} {caps.get('browserVersion', '')}".strip()
        self.dt.call("session.subscribe", events=["browsingContext.userPromptOpened"])
        self.context = self.dt.call("browsingContext.getTree")["contexts"][0]["context"]

    def navigate(self, url):
        self.dt.call("browsingContext.navigate", context=self.context, url=url, wait="none")

    def evaluate(self, expression):
        r = self.dt.call("script.evaluate", tolerate=True, expression=expression, target={"context": self.context},
                         awaitPromise=False)
        if not r or r.get("type") != "success":
            return None  # it threw, or the page was between documents
        return r["result"].get("value")

    def screenshot(self):
        return base64.b64decode(self.dt.call("browsingContext.captureScreenshot", context=self.context,
                                             origin="document")["data"])


def wait_for_file(path, why):
    for _ in range(300):
        if os.path.exists(path) and open(path).read().strip():
            try:
                if not path.endswith(".json") or json.load(open(path)):
                    return
            except ValueError:
                pass  # still being written
        time.sleep(0.1)
    fail(why)


def run_timeline(kind, binary, url, shot):
    """The --timeline check (see the module's text)."""
    profile = tempfile.mkdtemp()
    browser = None
    try:
        browser = kind(binary, profile)

        def wait_for(expression, what, seconds=60):
            end = time.time() + seconds
            while time.time() < end:
                v = browser.evaluate(expression)
                if v:
                    return v
                time.sleep(0.2)
            fail(f"{browser.name}: timed out waiting for {what}; the page says: "
                 f"{browser.evaluate('document.body && document.body.innerText')}")

        browser.navigate(url)
        shown = ("(() => { const i = document.getElementById('timeline-img');"
                 " return !document.getElementById('timeline').hidden && i.complete && i.naturalWidth > 0"
                 " && i.getAttribute('src'); })()")
        first = wait_for(shown, "the drawing of the measured step")
        if not first.startswith("/timeline.svg?n="):
            fail(f"{browser.name}: the drawing comes from {first}")
        wait_for(f"(() => {{ const s = {shown}; return s && s !== {json.dumps(first)}; }})()",
                 "a newer measured step")
        text = browser.evaluate("document.body.innerText")
        if "the last measured step" not in text or "step ms (measured)" not in text:
            fail(f"{browser.name}: the page lacks the measured step: {text[:2000]}")
        for m in browser.dt.events:
            if m.get("method") in DIALOG_EVENTS:
                fail(f"{browser.name}: a dialog opened")
        browser.evaluate("document.getElementById('timeline').scrollIntoView(); true")
        time.sleep(0.5)
        png = browser.screenshot()
        if not png.startswith(b"\x89PNG\r\n\x1a\n") or len(png) < 1000:
            fail(f"{browser.name}: the screenshot is no PNG ({len(png)} bytes)")
        if shot:
            with open(shot, "wb") as f:
                f.write(png)
        print(f"dashboard_browser: ok, the measured timeline ({browser.name})")
    finally:
        if browser:
            browser.process.terminate()
            try:
                browser.process.wait(10)
            except subprocess.TimeoutExpired:
                browser.process.kill()
        shutil.rmtree(profile, ignore_errors=True)


def main():
    if len(sys.argv) in (4, 5) and sys.argv[2] == "--timeline":
        binary = sys.argv[1]
        run_timeline(Firefox if "firefox" in os.path.basename(binary) else Chromium, binary, sys.argv[3],
                     sys.argv[4] if len(sys.argv) == 5 else None)
        return
    if len(sys.argv) < 5:
        fail("usage: dashboard_browser.py BROWSER URL TOKEN EXPECTED_TEXT [SCREENSHOT.png]")
    binary, url, token, expected = sys.argv[1:5]
    shot = sys.argv[5] if len(sys.argv) > 5 else None
    profile = tempfile.mkdtemp()
    kind = Firefox if "firefox" in os.path.basename(binary) else Chromium
    browser = None
    try:
        browser = kind(binary, profile)

        def wait_for(expression, what, seconds=30):
            end = time.time() + seconds
            while time.time() < end:
                v = browser.evaluate(expression)
                if v:
                    return v
                time.sleep(0.2)
            fail(f"{browser.name}: timed out waiting for {what}; the page says: "
                 f"{browser.evaluate('document.body && document.body.innerText')}")

        # Unsigned, the dashboard refuses and points at its login page.
        browser.navigate(url)
        wait_for("document.readyState === 'complete' && document.body.innerText.includes('sign in')", "the refusal")
        browser.navigate(url.rstrip("/") + "/login")
        wait_for("document.readyState === 'complete' && !!document.querySelector('input[name=token]')", "the login form")
        browser.evaluate(f"document.querySelector('input[name=token]').value = {json.dumps(token)};"
                         "document.querySelector('form').submit(); true")
        wait_for("location.pathname === '/' && document.querySelectorAll('#nodes tr').length >= 3",
                 "the node list (two nodes)")
        first = browser.evaluate("Number(document.body.dataset.firstVersion)")
        wait_for(f"Number(document.body.dataset.version) > {first}", "a live update")
        text = browser.evaluate("document.body.innerText")
        if expected not in text:
            fail(f"{browser.name}: {expected!r} is not on the page as text: {text[:2000]}")
        if browser.evaluate("document.querySelectorAll('img[src=x], img[onerror]').length") != 0:
            fail(f"{browser.name}: a name became markup: an <img> element is on the page")
        if browser.evaluate("document.cookie") != "":
            fail(f"{browser.name}: the session cookie is readable by script (it must be HttpOnly)")
        if browser.evaluate("document.getElementById('live').textContent") != "live":
            fail(f"{browser.name}: the page does not follow the event stream")
        # Events that came while waiting: a dialog would have been one.
        for m in browser.dt.events:
            if m.get("method") in DIALOG_EVENTS:
                fail(f"{browser.name}: a dialog opened")
        png = browser.screenshot()
        if not png.startswith(b"\x89PNG\r\n\x1a\n") or len(png) < 1000:
            fail(f"{browser.name}: the screenshot is no PNG ({len(png)} bytes)")
        if shot:
            with open(shot, "wb") as f:
                f.write(png)
        print(f"dashboard_browser: ok ({browser.name})")
    finally:
        if browser:
            browser.process.terminate()
            try:
                browser.process.wait(10)
            except subprocess.TimeoutExpired:
                browser.process.kill()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
