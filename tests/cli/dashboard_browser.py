#!/usr/bin/env python3
"""Loads a troupe dashboard in headless Chromium over the DevTools protocol (standard library only).

    dashboard_browser.py CHROMIUM URL TOKEN EXPECTED_TEXT [SCREENSHOT.png]

Signs in through the dashboard's login page with TOKEN (the form and its cookie, as a person
would), waits for the node list and for a live update (a state version newer than the first one
the page showed), checks that EXPECTED_TEXT is on the page as text, that no element came out of
it (no <img src=x>) and that no dialog opened (a hostile name that ran script would alert), and
takes a screenshot. Prints "dashboard_browser: ok" or exits 1 saying why.
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

    def call(self, method, **params):
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            m = self._message()
            if m.get("id") == self.next_id:
                if "error" in m:
                    fail(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)
            if m.get("method") == "Page.javascriptDialogOpening":
                fail("a dialog opened: " + json.dumps(m.get("params")))

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r.get("result", {}).get("value")


def main():
    if len(sys.argv) < 5:
        fail("usage: dashboard_browser.py CHROMIUM URL TOKEN EXPECTED_TEXT [SCREENSHOT.png]")
    chromium, url, token, expected = sys.argv[1:5]
    shot = sys.argv[5] if len(sys.argv) > 5 else None
    profile = tempfile.mkdtemp()
    browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                "--remote-debugging-port=0", "--user-data-dir=" + profile, "--window-size=1100,640",
                                "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        for _ in range(300):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.1)
        else:
            fail("Chromium did not open its DevTools port")
        port = open(port_file).read().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(p for p in pages if p["type"] == "page")
        dt = DevTools(page["webSocketDebuggerUrl"])
        dt.call("Page.enable")
        dt.call("Runtime.enable")

        def wait_for(expression, what, seconds=20):
            end = time.time() + seconds
            while time.time() < end:
                v = dt.evaluate(expression)
                if v:
                    return v
                time.sleep(0.2)
            fail(f"timed out waiting for {what}; the page says: {dt.evaluate('document.body && document.body.innerText')}")

        # Unsigned, the dashboard refuses and points at its login page.
        dt.call("Page.navigate", url=url)
        wait_for("document.readyState === 'complete' && document.body.innerText.includes('sign in')", "the refusal")
        dt.call("Page.navigate", url=url.rstrip("/") + "/login")
        wait_for("document.readyState === 'complete' && !!document.querySelector('input[name=token]')", "the login form")
        dt.evaluate(f"document.querySelector('input[name=token]').value = {json.dumps(token)};"
                    "document.querySelector('form').submit(); true")
        wait_for("location.pathname === '/' && document.querySelectorAll('#nodes tr').length >= 3",
                 "the node list (two nodes)")
        first = dt.evaluate("Number(document.body.dataset.firstVersion)")
        wait_for(f"Number(document.body.dataset.version) > {first}", "a live update")
        text = dt.evaluate("document.body.innerText")
        if expected not in text:
            fail(f"{expected!r} is not on the page as text: {text[:2000]}")
        if dt.evaluate("document.querySelectorAll('img[src=x], img[onerror]').length") != 0:
            fail("a name became markup: an <img> element is on the page")
        if dt.evaluate("document.cookie") != "":
            fail("the session cookie is readable by script (it must be HttpOnly)")
        # Events that came while waiting: a dialog would have been one.
        for m in dt.events:
            if m.get("method") == "Page.javascriptDialogOpening":
                fail("a dialog opened")
        if shot:
            data = dt.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
            with open(shot, "wb") as f:
                f.write(base64.b64decode(data))
        print("dashboard_browser: ok")
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
