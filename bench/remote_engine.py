"""ENGINE=openai in front of two llama-servers, against the same requests sent straight to them.

    python bench/remote_engine.py [--concurrency 8,32] [--max-tokens 64] [--slots 16]
        [--threads 1] [--stop-trials 5] [--runs 1] [--pin]

Two llama.cpp `llama-server`s (tests/llama_server.py; built once by tests/llama_cpp_build.py) with
SmolLM2, `--slots` slots each; the app (uvicorn, ENGINE=openai, a fresh SQLite database, one user
with an API key, the per-user reply cap lifted) sends to both. Per concurrency level N, a burst of
N streaming `/v1/chat/completions` requests goes through the app, and the same burst goes direct
(request i to upstream i mod 2, what the app's least-outstanding routing does with equal
replies), sampling alike (`VIA_APP`: direct, with every field the app sends a llama-server for
them); the order alternates between runs. Printed side by side with the ratio app / direct:
aggregate tok/s (usage completion tokens / the burst's wall time), TTFT p50/p99 (request sent ->
first chunk with text), inter-chunk gap p50/p99, each the median over `--runs`. A warm-up burst goes to both upstreams first (a
fresh llama-server's first requests take seconds longer).

Then Stop: `--stop-trials` times, a 600-token reply is streamed, and after 5 chunks its client
hangs up (the `/v1` API's disconnect grace is 0, so that is its Stop) — through the app, and
direct — and the time from the hang-up to both upstreams' `/slots` showing no slot processing is
measured (polled every 5 ms; each poll is answered by llama-server's own loop between steps).

With `--pin` the upstreams run on CPU 0 and the app and this client on the other CPUs (Linux
affinity, every thread), as deploy/SCALING.md puts them on different machines: unpinned on a
2-CPU box every CPU-second the app spends is taken from the upstreams, which measures the box
rather than the app in front.

Request and stream helpers are bench/vs_llama_server.py's (issue 12).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from serving_overhead import ROOT, Server, fmt, pct, print_table, ratio, run_loop, sqlite_url
from vs_llama_server import Stream, Target, app_target, prompt, stream_chat

sys.path.insert(0, str(ROOT))

from app.engine.base import SamplingParams
from app.engine.openai.sampling import sampling_fields
from tests.llama_server import LlamaServer

# Both ways sample alike: through the app, the /v1 fields (the rest are the app's defaults,
# app/domain/chat/replies/limits.py); direct, every field the app forwards to a llama-server for them
# (app/engine/openai/sampling.py), not llama-server's own defaults (top-k 40, no repeat penalty).
VIA_APP = {"temperature": 0.8, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1}


def sampling(target: Target, max_tokens: int) -> dict[str, Any]:
    if target.name == "app":
        return dict(VIA_APP)
    return sampling_fields(SamplingParams(max_tokens=max_tokens, **VIA_APP), "llamacpp")


def pin(pid: int, cpus: set[int]) -> None:
    """Move every thread of process `pid` onto `cpus` (threads made later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


async def burst(targets: list[Target], n: int, tag: str, max_tokens: int) -> list[Stream]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30), limits=limits) as client:

        def body(i: int, target: Target) -> dict[str, Any]:
            return {
                "model": target.model,
                "messages": [{"role": "user", "content": prompt("short", f"{tag}-{i}", i, 0)}],
                "max_tokens": max_tokens,
                **sampling(target, max_tokens),
                "stream": True,
                "stream_options": {"include_usage": True},
            }

        return list(
            await asyncio.gather(
                *(
                    stream_chat(
                        client, targets[i % len(targets)], body(i, targets[i % len(targets)])
                    )
                    for i in range(n)
                )
            )
        )


def figures(streams: list[Stream]) -> dict[str, float]:
    ok = [s for s in streams if not s.error]
    wall = max(s.end for s in streams) - min(s.sent for s in streams)
    ttft = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    gaps = [g for s in ok for g in s.gaps_ms]
    return {
        "tok_s": sum(s.tokens for s in ok) / wall,
        "ttft_p50": pct(ttft, 0.5),
        "ttft_p99": pct(ttft, 0.99),
        "gap_p50": pct(gaps, 0.5),
        "gap_p99": pct(gaps, 0.99),
        "errors": len(streams) - len(ok),
    }


async def slots_idle(upstreams: list[LlamaServer], client: httpx.AsyncClient) -> None:
    while True:
        answers = await asyncio.gather(*(client.get(f"{u.url}/slots") for u in upstreams))
        if not any(slot["is_processing"] for a in answers for slot in a.json()):
            return
        await asyncio.sleep(0.005)


async def stop_to_slot_free(target: Target, upstreams: list[LlamaServer], tag: str) -> float:
    """Seconds from a client's hang-up mid-reply to every upstream slot idle."""
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompt("short", tag, 0, 0)}],
        "max_tokens": 600,
        **sampling(target, 600),
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream(
            "POST", f"{target.base_url}/chat/completions", json=body, headers=target.headers
        ) as response:
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("data: {")
                if seen >= 5:
                    break
            hung_up = time.perf_counter()
        await asyncio.wait_for(slots_idle(upstreams, client), timeout=30)
        return time.perf_counter() - hung_up


async def bench(args: argparse.Namespace, upstreams: list[LlamaServer], app: Server) -> None:
    via_app = await app_target(app)
    direct = [
        Target(f"direct-{i}", u.openai_url, {}, via_app.model) for i, u in enumerate(upstreams)
    ]
    # A fresh llama-server's first requests are slow (seconds more TTFT): warm both up first.
    await burst(direct, max(4, max(args.concurrency) // 2), "warm-up", 8)
    rows, summary = [], []
    for n in args.concurrency:
        results: dict[str, list[dict[str, float]]] = {"app": [], "direct": []}
        for run in range(args.runs):
            order = [("app", [via_app]), ("direct", direct)]
            for name, targets in order if run % 2 == 0 else order[::-1]:
                streams = await burst(targets, n, f"{name}-{n}-{run}", args.max_tokens)
                results[name].append(figures(streams))
        load = os.getloadavg()[0]
        for name in ("direct", "app"):
            f = {k: statistics.median(r[k] for r in results[name]) for k in results[name][0]}
            rows.append([f"{n} x {name}", fmt(f["tok_s"]), fmt(f["ttft_p50"]), fmt(f["ttft_p99"]),
                         fmt(f["gap_p50"]), fmt(f["gap_p99"]), str(int(f["errors"])), fmt(load, 2)])  # fmt: skip
        a, d = (
            {k: statistics.median(r[k] for r in results[name]) for k in results[name][0]}
            for name in ("app", "direct")
        )
        summary.append([str(n), ratio(a["tok_s"], d["tok_s"]), fmt(a["ttft_p50"] - d["ttft_p50"]),
                        ratio(a["gap_p50"], d["gap_p50"])])  # fmt: skip
    print(f"\n== {args.max_tokens}-token replies, {VIA_APP}, 2 upstreams x {args.slots} slots")
    print_table(["case", "tok/s", "TTFT p50", "p99", "gap p50", "p99", "errors", "load"], rows)
    print("\n== app / direct")
    print_table(["streams", "tok/s", "TTFT p50 +ms", "gap p50"], summary)
    if not args.stop_trials:
        return

    stops: dict[str, list[float]] = {"app": [], "direct": []}
    for trial in range(args.stop_trials):
        for name, target in (("direct", direct[trial % 2]), ("app", via_app)):
            stops[name].append(await stop_to_slot_free(target, upstreams, f"stop-{name}-{trial}"))
    print("\n== hang-up mid-reply -> upstream slot idle (ms)")
    print_table(
        ["path", "p50", "max", "each"],
        [
            [
                name,
                fmt(pct(v, 0.5) * 1000),
                fmt(max(v) * 1000),
                " ".join(f"{x * 1000:.0f}" for x in v),
            ]
            for name, v in stops.items()
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    levels = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--concurrency", type=levels, default=[8, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stop-trials", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--pin", action="store_true", help="upstreams on CPU 0, app and client on the rest"
    )
    args = parser.parse_args(argv)
    upstream_cpus = {0}
    front_cpus = set(range(os.cpu_count() or 2)) - upstream_cpus
    if args.pin:  # the app (started from here) inherits this process's CPUs
        pin(os.getpid(), front_cpus)
    with tempfile.TemporaryDirectory(prefix="remote-bench-") as tmp:
        folder = Path(tmp)
        upstreams = [
            LlamaServer(
                folder / f"upstream-{i}.log",
                parallel=args.slots,
                slot_context=1024,
                threads=args.threads,
                name=f"upstream-{i}",
            )
            for i in range(2)
        ]
        try:
            for upstream in upstreams:
                upstream.start()
                if args.pin:
                    assert upstream.process is not None
                    pin(upstream.process.pid, upstream_cpus)
            env = {
                "ENGINE": "openai",
                "ENGINE_UPSTREAMS": ",".join(u.openai_url for u in upstreams),
                "DATABASE_URL": sqlite_url(folder),
                "DATA_DIR": str(folder),
                "API_GRACE_S": "0",
            }
            app = Server(env, folder / "app.log")
            app.start()
            try:
                print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
                if args.pin:
                    print(
                        f"pinned: upstreams on CPUs {upstream_cpus}, app and client on {front_cpus}"
                    )
                run_loop(bench(args, upstreams, app))
            finally:
                app.stop()
        finally:
            for upstream in upstreams:
                upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
