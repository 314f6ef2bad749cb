"""`python -m app.engine.process` in a subprocess, for tests and benchmarks.

with EngineProcess(tmp / "engine.sock", {"ENGINE": "llamacpp", ...}, log) as proc:
    ...  # web workers (or an EngineProcessClient) use ENGINE=process ENGINE_SOCKET=proc.socket
    proc.kill()      # SIGKILL: what a crash looks like to the workers
    proc.start()     # again, on the same socket
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.live_server import ServerError, end_process

ROOT = Path(__file__).resolve().parents[1]


class EngineProcess:
    def __init__(
        self,
        socket: Path,
        env: Mapping[str, str],
        log_path: Path,
        ready_timeout_s: float = 120.0,
    ) -> None:
        self.socket = socket
        self.env = {**os.environ, **env, "ENGINE_SOCKET": str(socket)}
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> EngineProcess:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.engine.process"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while b"serving on" not in self.log_path.read_bytes()[offset:]:
            if self.process.poll() is not None:
                raise ServerError(f"the engine process exited: {self.log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise ServerError(f"the engine process did not start: {self.log_path}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> int | None:
        code = end_process(self.process, timeout_s=15)
        self.process = None
        return code

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
