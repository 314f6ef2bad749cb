"""One user floods, another sends: the other's time to first token, idle against flooded.

    python bench/fairness.py [--engines synthetic,llamacpp] [--flood 60] [--probes 5]
        [--caps 8,0] [--flood-tokens 400] [--probe-tokens 8] [--server-env NAME=VALUE]

For each engine and each per-user cap (`MAX_REPLIES_PER_USER`; 0 = no cap) a fresh server (its
own process, a fresh SQLite database) is started and two users sign up:

1. idle: the probe user sends `--probes` messages one after the other (each in a new
   conversation, the same short question) on an otherwise idle server; TTFT = request sent ->
   first `delta` event, as the client sees it (page SSE).
2. flooded: the flooder opens the page's WebSocket and sends `--flood` `send` frames at once, each
   asking for a long reply; as soon as its replies stream, the probe user sends the same
   messages again, one after the other, while the flood runs.

Printed per run: the flooder's accepted and rejected sends, engine running/waiting when the
probes ran, the probe's median and worst TTFT idle and flooded, and flooded/idle, as the client
saw it and as the engine did (the `final` event's `timings.ttft_ms`: queued -> first token, so
without HTTP and the event loop). The issue's target: flooded/idle within 2x. The cap-0 run shows what fair admission alone does (the
flooder's replies hold every slot, so the probe waits for one of them to end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from serving_overhead import (
    ROOT,
    Server,
    new_client,
    new_conversations,
    signup,
    sqlite_url,
    stream_reply,
)
from websockets.asyncio.client import connect

PROBE = "What is the capital of France?"
STORY_TOPICS = ("a lighthouse", "a robot", "bread", "the sea", "a dragon", "a cat", "the moon")


@dataclass
class Run:
    engine: str
    cap: int
    idle: list[float] = field(default_factory=list)  # client-side TTFT, s
    flooded: list[float] = field(default_factory=list)
    idle_engine: list[float] = field(default_factory=list)  # engine-side TTFT (queued -> token), s
    flooded_engine: list[float] = field(default_factory=list)
    accepted: int = 0
    rejected: int = 0
    busy: list[tuple[int, int]] = field(default_factory=list)  # engine (running, waiting)


def flood_content(engine: str, i: int) -> str:
    topic = STORY_TOPICS[i % len(STORY_TOPICS)]
    if engine == "synthetic":
        return f"[[synthetic:tokens=100000]] {i}: tell me about {topic}."
    return f"Write a long, detailed story about {topic} ({i})."


async def probe(client: httpx.AsyncClient, n: int, max_tokens: int) -> list[tuple[float, float]]:
    """(client TTFT, engine TTFT) of `n` probes sent one after the other."""
    ttfts = []
    for conversation in await new_conversations(client, n):
        result = await stream_reply(client, conversation, PROBE, max_tokens=max_tokens)
        if result.status_code != 200 or result.ttft_s is None:
            raise RuntimeError(f"probe failed: {result.status_code} {result.error}")
        engine_ms = (result.final or {}).get("timings", {}).get("ttft_ms") or float("nan")
        ttfts.append((result.ttft_s, engine_ms / 1000))
    return ttfts


async def engine_load(admin: httpx.AsyncClient) -> tuple[int, int]:
    stats = (await admin.get("/admin/api/engine")).json()
    return stats["running"], stats["waiting"]


async def run_one(server: Server, run: Run, args: argparse.Namespace) -> None:
    async with (
        new_client(server.url) as admin,
        new_client(server.url) as flooder,
        new_client(server.url) as prober,
    ):
        await signup(admin)  # the first user is the admin: she reads the engine's stats
        await signup(flooder)
        await signup(prober)
        await probe(prober, 1, args.probe_tokens)  # warm-up: imports, first-request costs
        for client_s, engine_s in await probe(prober, args.probes, args.probe_tokens):
            run.idle.append(client_s)
            run.idle_engine.append(engine_s)

        conversations = await new_conversations(flooder, args.flood)
        cookie = "; ".join(f"{k}={v}" for k, v in flooder.cookies.items())
        ws_url = server.url.replace("http", "ws", 1) + "/ws"
        async with connect(
            ws_url, additional_headers={"Cookie": cookie, "Origin": server.url}
        ) as ws:
            for i, conversation in enumerate(conversations):
                frame = {"type": "send", "conversation_id": conversation, "client_ref": str(i),
                         "content": flood_content(run.engine, i), "max_tokens": args.flood_tokens}  # fmt: skip
                await ws.send(json.dumps(frame))
            message_ids: list[str] = []
            streaming = False
            while run.accepted + run.rejected < args.flood or not streaming:
                frame = json.loads(await ws.recv())
                if frame["type"] == "start":
                    run.accepted += 1
                    message_ids.append(frame["message_id"])
                elif frame["type"] == "rejected":
                    run.rejected += 1
                elif frame["type"] == "delta":
                    streaming = True

            async def drain() -> None:
                with contextlib.suppress(Exception):
                    async for _ in ws:
                        pass

            drainer = asyncio.create_task(drain())  # keep reading: a stuck client is cut off
            for _ in range(args.probes):
                run.busy.append(await engine_load(admin))
                ((client_s, engine_s),) = await probe(prober, 1, args.probe_tokens)
                run.flooded.append(client_s)
                run.flooded_engine.append(engine_s)
            for message_id in message_ids:
                await ws.send(json.dumps({"type": "cancel", "message_id": message_id}))
            await asyncio.sleep(1.0)
            drainer.cancel()


def _med_max(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} / {max(values) * 1000:.0f}"


def report(runs: Sequence[Run]) -> None:
    print(
        f"\n{'engine':<10} {'cap':>4} {'flood ok/rej':>13} {'run/wait':>9}  TTFT ms, median / max:"
        f" {'idle':>11} {'flooded':>13} {'flooded/idle':>13} | engine side: {'idle':>9} "
        f"{'flooded':>11} {'ratio':>6}"
    )
    for r in runs:
        ratio = statistics.median(r.flooded) / statistics.median(r.idle)
        engine_ratio = statistics.median(r.flooded_engine) / statistics.median(r.idle_engine)
        busy = "/".join(str(round(statistics.median(x))) for x in zip(*r.busy, strict=True))
        print(
            f"{r.engine:<10} {r.cap or 'off':>4} {f'{r.accepted}/{r.rejected}':>13} {busy:>9}  "
            f"{'':>22} {_med_max(r.idle):>11} {_med_max(r.flooded):>13} {ratio:>12.2f}x | "
            f"{'':>12} {_med_max(r.idle_engine):>9} {_med_max(r.flooded_engine):>11} "
            f"{engine_ratio:>5.2f}x"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", default="synthetic,llamacpp")
    p.add_argument("--caps", default="8,0", help="MAX_REPLIES_PER_USER values (0: no cap)")
    p.add_argument("--flood", type=int, default=60, help="sends on the flooder's socket")
    p.add_argument("--flood-tokens", type=int, default=400, help="max_tokens of each flood reply")
    p.add_argument("--probes", type=int, default=5, help="probe messages, idle and flooded")
    p.add_argument("--probe-tokens", type=int, default=8, help="max_tokens of each probe")
    p.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args(argv)
    extra_env = dict(item.split("=", 1) for item in args.server_env)
    runs: list[Run] = []
    work = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    try:
        for engine in args.engines.split(","):
            for cap in (int(c) for c in args.caps.split(",")):
                folder = work / f"{engine}-{cap}"
                folder.mkdir()
                env = {
                    "ENGINE": engine,
                    "DATA_DIR": str(folder),
                    "DATABASE_URL": sqlite_url(folder),
                    "MAX_REPLIES_PER_USER": str(cap),
                    "CLIENT_DEADLINE_S": "3600",
                    **extra_env,
                }
                print(f"== {engine}, MAX_REPLIES_PER_USER={cap}: starting the server", flush=True)
                server = Server(env, folder / "server.log").start()
                try:
                    run = Run(engine, cap)
                    asyncio.run(run_one(server, run, args))
                    runs.append(run)
                    report([run])
                finally:
                    server.stop()
                    server.print_errors()
        print("\nall runs:")
        report(runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
