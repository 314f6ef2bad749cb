"""Web workers sharing one engine process against one process with the engine in it (issue 25,
items 5 and 6): a burst of page streams from the synthetic engine, each layout in turn.

    python bench/web_workers.py --database-url postgresql://postgres@127.0.0.1/bench \\
        [--layouts inproc,1,2] [--streams 1024] [--tokens 300] [--step-ms 20]
        [--per-seq-ms 0.01] [--rounds 2] [--profile DIR]

Layouts: `inproc` is today's default (one uvicorn process, ENGINE=synthetic in it); a number N is
`python -m app.engine.process` serving the same synthetic engine plus N uvicorn workers with
ENGINE=process (deploy/SCALING.md). Every layout keeps its sessions in Redis (workers must share
them), so the engine's place is all that differs. The client (this
process, bench/serving_overhead.py's raw client) signs up once, makes the conversations, and
opens every stream at once, spreading them over the workers as a proxy would. Per layout and
round it prints: delivered tok/s, added TTFT p50 (the client's TTFT less the engine's own),
response headers p50, gap p99 overhead (client's p99 gap less the engine's, per stream: median
and p99 stream), server CPU (1.00 = one core) and CPU per delivered token, each split into the
web processes and the engine process (for `inproc` the engine's work is in the web process),
and the end states. The per-token split is what a machine with a core per process would scale
by: one engine process delivers at most 1 / its us per token, each worker 1 / its own. The layouts alternate within each round, so they share the machine's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serving_overhead import (  # noqa: E402
    Server,
    StreamResult,
    fmt,
    new_client,
    new_conversations,
    pct,
    print_profile,
    print_table,
    proc_cpu_s,
    run_loop,
    signup,
    stream_reply_raw,
    synthetic_content,
)
from tests.engine_process import EngineProcess  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/11"


class Layout:
    """The server processes of one layout, started and stopped together."""

    def __init__(self, name: str, env: dict[str, str], work: Path) -> None:
        self.name = name
        self.engine: EngineProcess | None = None
        self.workers: list[Server] = []
        folder = work / f"layout-{name}"
        folder.mkdir()
        with redis.Redis.from_url(REDIS_URL) as store:  # this bench's own Redis database:
            store.flushdb()  # no sessions or sign-up counts left from an earlier layout
        if name == "inproc":
            self.workers.append(Server(env, folder / "server.log").start())
            return
        self.engine = EngineProcess(folder / "engine.sock", env, folder / "engine.log").start()
        shared = {**env, "ENGINE": "process", "ENGINE_SOCKET": str(self.engine.socket)}
        try:
            for i in range(int(name)):
                worker_env = {**shared, "REPLICA_ID": f"w{i}"}
                server = Server(worker_env, folder / f"worker-{i}.log")
                server.migrate = i == 0  # one migration, before the others start
                self.workers.append(server.start())
        except BaseException:
            self.stop()  # no process left behind by a layout that did not come up
            raise

    @property
    def pids(self) -> list[int]:
        pids = [w.pid for w in self.workers]
        if self.engine is not None and self.engine.process is not None:
            pids.append(self.engine.process.pid)
        return pids

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far: (every worker, the engine process; 0 for inproc)."""
        workers = sum(proc_cpu_s(w.pid) for w in self.workers)
        engine = self.engine
        return workers, (proc_cpu_s(engine.process.pid) if engine and engine.process else 0.0)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
            worker.print_errors()
        if self.engine is not None:
            self.engine.stop()


async def burst(
    layout: Layout, streams: int, tokens: int, profile: Path | None = None
) -> list[str]:
    clients = [new_client(w.url) for w in layout.workers]
    try:
        await signup(clients[0])
        for client in clients[1:]:
            client.cookies = clients[0].cookies  # one log-in, valid on every worker (Redis)
        content = synthetic_content(tokens)
        warm = [(c, conv) for c in clients for conv in await new_conversations(c, 2)]
        await asyncio.gather(  # warm-up: first-request costs out of the figures
            *(stream_reply_raw(c, conv, content(0), max_tokens=tokens) for c, conv in warm)
        )
        conversations = await new_conversations(clients[0], streams)
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(
                stream_reply_raw(
                    clients[i % len(clients)], conv, content(i), max_tokens=tokens, start=start
                )
            )
            for i, conv in enumerate(conversations)
        ]
        await asyncio.sleep(0.2)  # every task waits at the gate
        (web0, engine0), t0 = layout.cpu_s(), time.monotonic()
        start.set()
        spies = [] if profile is None else await spy(layout, profile)
        results = await asyncio.gather(*tasks)
        for process in spies:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            await process.wait()
        (web1, engine1), wall = layout.cpu_s(), time.monotonic() - t0
        cpu = (web1 - web0, engine1 - engine0)
    finally:
        for client in clients:
            await client.aclose()
    return row(layout.name, results, wall, cpu)


async def spy(layout: Layout, folder: Path) -> list[asyncio.subprocess.Process]:
    """py-spy on every server process of the layout, through the burst (files in `folder`)."""
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    names = [f"worker-{i}" for i in range(len(layout.workers))] + ["engine"]
    return [
        await asyncio.create_subprocess_exec(
            binary,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "200",
            "--gil",
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(folder / f"{layout.name}-{name}.txt"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid, name in zip(layout.pids, names, strict=False)
    ]


def row(
    name: str, results: Sequence[StreamResult], wall: float, cpu: tuple[float, float]
) -> list[str]:
    ok = [r for r in results if r.ttft_s is not None and r.final]
    tokens = sum((r.final or {}).get("usage", {}).get("completion_tokens", 0) for r in ok)
    timings = [(r.final or {}).get("timings", {}) for r in ok]
    added = [
        r.ttft_s * 1000 - t["ttft_ms"]
        for r, t in zip(ok, timings, strict=True)
        if r.ttft_s is not None and t.get("ttft_ms") is not None
    ]
    headers = [(r.headers_at - r.sent_at) * 1000 for r in ok if r.headers_at]
    gap_over = [
        pct(r.gaps_s, 0.99) * 1000 - t["gap_p99_ms"]
        for r, t in zip(ok, timings, strict=True)
        if r.gaps_s and t.get("gap_p99_ms") is not None
    ]
    states = Counter(
        (r.final or {}).get("status") or r.error or f"http {r.status_code}" for r in results
    )
    return [
        name,
        f"{len(ok)}/{len(results)}",
        fmt(tokens / wall, 0),
        fmt(pct(added, 0.5), 0),
        fmt(pct(headers, 0.5), 0),
        f"{fmt(statistics.median(gap_over), 0)} / {fmt(pct(gap_over, 0.99), 0)}"
        if gap_over
        else "-",
        f"{fmt(sum(cpu) / wall, 2)} ({fmt(cpu[0] / wall, 2)} + {fmt(cpu[1] / wall, 2)})",
        f"{fmt(cpu[0] / tokens * 1e6, 0)} + {fmt(cpu[1] / tokens * 1e6, 0)}" if tokens else "-",
        ",".join(f"{k}:{v}" for k, v in sorted(states.items())),
    ]


HEADERS = [
    "layout",
    "ok",
    "tok/s",
    "added TTFT p50 ms",
    "headers p50 ms",
    "gap p99 over, median / p99 stream ms",
    "server CPU (web + engine proc.)",
    "us/token web + engine proc.",
    "end states",
]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--database-url", required=True, help="PostgreSQL (workers share it)")
    p.add_argument("--layouts", default="inproc,1,2")
    p.add_argument("--streams", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--per-seq-ms", type=float, default=0.01)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--profile", type=Path, default=None, metavar="DIR", help="py-spy each process")
    args = p.parse_args(argv)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    env = {
        "ENGINE": "synthetic",
        "DATA_DIR": str(work),
        "SIGNUP_MODE": "open",  # a fresh user per layout, in a database that outlives the run
        # sessions in Redis for every layout (workers must share them): only the engine differs
        "SESSION_STORE_URL": REDIS_URL,
        "DATABASE_URL": args.database_url,
        "ENGINE_MAX_SEQS": str(args.streams),
        "ENGINE_KV_CELLS": str(args.streams * (args.tokens + 256) + 4096),
        "SYNTHETIC_STEP_MS": str(args.step_ms),
        "SYNTHETIC_PER_SEQ_MS": str(args.per_seq_ms),
    }
    load = os.getloadavg()[0]
    print(
        f"work folder {work}; {os.cpu_count()} CPUs, load {load:.1f}; {args.streams} streams x "
        f"{args.tokens} tokens, step {args.step_ms} + {args.per_seq_ms} ms/seq"
    )
    rows = []
    for round_no in range(args.rounds):
        for name in args.layouts.split(","):
            (work / f"r{round_no}").mkdir(exist_ok=True)
            layout = Layout(name, env, work / f"r{round_no}")
            try:
                rows.append(run_loop(burst(layout, args.streams, args.tokens, args.profile)))
                if args.profile:
                    for path in sorted(args.profile.glob(f"{name}-*.txt")):
                        print_profile(path, top=12)
            finally:
                layout.stop()
            print_table(HEADERS, rows[-1:])
            sys.stdout.flush()
    print(f"\nall rounds (load now {os.getloadavg()[0]:.1f}):")
    print_table(HEADERS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
