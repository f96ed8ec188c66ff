"""Starting `kvtier serve` for a test: loopback only, a free port chosen by the server (--port 0, read
from its start line), bounded waits; stopping it with SIGTERM and checking that it exits cleanly
(a crash or a hang fails the test)."""
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import kvtier_bin, model, with_isa  # noqa: E402,F401


class Server:
    def __init__(self, mdl, *extra, api_key=None):
        args = ["serve", "-m", str(mdl), "--host", "127.0.0.1", "--port", "0", "-t", "2", *map(str, extra)]
        if api_key:
            args += ["--api-key", api_key]
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen([kvtier_bin(), *with_isa(args)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        line = ""
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"serving (\S+) on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.model_id, self.port = m.group(1), int(m.group(2))
                break
        else:
            line = ""
        if not line or not hasattr(self, "port"):
            self.proc.kill()
            raise AssertionError(f"the server did not start: {line}{self.proc.stderr.read()}")
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key

    def get(self, path, headers=None):
        req = urllib.request.Request(self.base + path, headers=headers or (
            {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}))
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode()

    def metrics(self):
        out = {}
        for line in self.get("/metrics").splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def rss_kib(self):
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        assert self.alive(), f"the server died (exit {self.proc.returncode}): {self.proc.stderr.read()}"
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server did not stop within 60 s of SIGTERM")
        err = self.proc.stderr.read()
        assert rc == 0, f"the server exited with {rc}: {err}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.alive():
            if exc[0] is None:
                self.stop()
            else:
                self.proc.kill()
                self.proc.wait()
