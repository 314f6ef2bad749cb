"""What starting a reply costs the server before its stream opens (issue 12, part 4), against an
older revision in the same run.

    python bench/setup_cost.py [--levels 64,256] [--sequential 60] [--tokens 100]
        [--baseline-rev REV] [--database-url postgresql://...]

Two servers run side by side (synthetic engine, each with its own fresh database): this tree,
and `--baseline-rev` exported with `git archive` (bench/final_save.py's `export_tree`), both
served through bench/setup_probe.py, which measures inside the server the event loop's CPU time
from a POST's arrival to its response's start, and the database round trips in that span. The
phases alternate between the two servers:

1. set-up, one request at a time (nothing else on the loop), in three rounds per server, the
   servers taking turns: `--sequential` page sends into new
   untitled conversations (a first turn: the conversation names itself), a second turn in each
   (one question and reply of history), and as many streaming `/v1/chat/completions` calls (a
   fresh `api` conversation each). Each reply is one token and read to its end before the next
   request. Per request: loop CPU µs p50 and mean, wall µs p50, SQL statements, transactions
   begun, pool check-outs.
2. bursts: N page streams opened at once (bench/serving_overhead.py's `run_level`, titled
   conversations made beforehand): TTFT as the client saw it, the engine's own TTFT (from
   enqueue, the `final` event's timings), and the added TTFT (the two paired per stream): what
   the serving path adds, mostly each request's set-up waiting its turn on the one event loop;
   and the server's event-loop thread's CPU from the first request sent to the last response's
   headers (/proc), per stream and as a share of that span (1.00: the loop never waited).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import serving_overhead as so  # bench/ is on sys.path when this script runs
from final_save import create_database, drop_database, export_tree

BENCH = Path(__file__).resolve().parent
PROBE = "/_bench/setup-probe"
ROUNDS = 3  # of sequential set-ups per server


def serve(tree: Path, database_url: str, folder: Path, most: int, tokens: int) -> so.Server:
    env = {
        "ENGINE": "synthetic",
        "DATABASE_URL": database_url,
        "DATA_DIR": str(folder),
        "ENGINE_MAX_SEQS": str(most),
        "ENGINE_KV_CELLS": str(most * (tokens + 256) + 4096),
        "PYTHONPATH": str(BENCH),  # setup_probe; `app` comes from `tree` (uvicorn's app dir)
    }
    server = so.Server(env, folder / "server.log")
    server.cwd = tree
    server.command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "setup_probe:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(server.port),
        "--timeout-graceful-shutdown",
        "5",
    ]
    return server.start()


async def probe_samples(client: Any) -> list[dict[str, Any]]:
    r = await client.get(PROBE)
    r.raise_for_status()
    return r.json()


async def api_key(client: Any) -> str:
    r = await client.post("/api/keys/", json={"name": "bench"}, headers=so.csrf(client))
    r.raise_for_status()
    return r.json()["secret"]


async def page_send(client: Any, conversation_id: str, content: str) -> None:
    result = await so.stream_reply(client, conversation_id, content, max_tokens=1)
    if result.final is None:
        raise RuntimeError(f"a page send did not end well: {result.error or result.status_code}")


async def api_call(client: Any, key: str, model: str, content: str) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/v1 answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for _ in r.aiter_raw():
            pass


async def model_name(client: Any, key: str) -> str:
    r = await client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
    r.raise_for_status()
    return r.json()["data"][0]["id"]


class Target:
    """One server and its logged-in client."""

    def __init__(self, label: str, server: so.Server, database_url: str) -> None:
        self.label, self.server, self.database_url = label, server, database_url
        self.client = so.new_client(server.url)
        self.key = ""
        self.model = ""

    async def open(self) -> None:
        await so.signup(self.client)
        self.key = await api_key(self.client)
        self.model = await model_name(self.client, self.key)

    async def sequential(self, n: int) -> dict[str, list[dict[str, Any]]]:
        """n first turns, n second turns, n /v1 calls, one at a time; the probe's samples."""
        out: dict[str, list[dict[str, Any]]] = {}
        content = "[[synthetic:tokens=1]] tell me about a lighthouse keeper"
        await probe_samples(self.client)  # forget what came before
        conversations = []
        for _ in range(n):
            r = await self.client.post("/api/conversations/", json={}, headers=so.csrf(self.client))
            r.raise_for_status()
            conversations.append(r.json()["id"])
        await probe_samples(self.client)
        for turn in ("page send, 1st turn", "page send, 2nd turn"):
            for c in conversations:
                await page_send(self.client, c, content)
            out[turn] = await probe_samples(self.client)
        for _ in range(n):
            await api_call(self.client, self.key, self.model, content)
        out["/v1 stream"] = await probe_samples(self.client)
        return out

    async def burst(self, n: int, tokens: int) -> so.LevelReport:
        return await so.run_level(
            self.client,
            self.server,
            self.database_url,
            self.label,
            n,
            so.synthetic_content(tokens),
            tokens,
        )


def setup_row(kind: str, label: str, samples: list[dict[str, Any]]) -> list[str]:
    ok = [s for s in samples if s["status"] == 200]
    cpu = [s["loop_cpu_us"] for s in ok]
    wall = [s["wall_us"] for s in ok]

    def per(name: str) -> str:
        return so.fmt(statistics.mean(s[name] for s in ok), 1) if ok else "-"

    return [
        kind,
        label,
        f"{len(ok)}/{len(samples)}",
        so.fmt(so.median(cpu), 0),
        so.fmt(statistics.mean(cpu), 0) if cpu else "-",
        so.fmt(so.median(wall), 0),
        per("statements"),
        per("transactions"),
        per("checkouts"),
    ]


def burst_row(rep: so.LevelReport) -> list[str]:
    ok = [r for r in rep.ok if r.ttft_s is not None]
    client = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    engine = [(r.final or {}).get("timings", {}).get("ttft_ms", float("nan")) for r in ok]
    added = [c - e for c, e in zip(client, engine, strict=True)]
    headers = [(r.headers_at - r.sent_at) * 1000 for r in ok if r.headers_at]
    # the server's event-loop thread over the set-up phase: first request sent to last headers
    began = min(r.sent_at for r in rep.results)
    opened = max((r.headers_at for r in ok if r.headers_at), default=began)
    loop_s = rep.sampler.cpu_at(opened)[1] - rep.sampler.cpu_at(began)[1]
    return [
        str(rep.streams),
        rep.label,
        f"{len(ok)}/{len(rep.results)}",
        so.fmt(so.median(client)),
        so.fmt(so.median(engine)),
        so.fmt(so.median(added)),
        so.fmt(so.pct(added, 0.99)),
        so.fmt(so.median(headers)),
        so.fmt(max(headers, default=float("nan"))),
        so.fmt(loop_s / rep.streams * 1000, 2),
        so.fmt(loop_s / (opened - began), 2) if opened > began else "-",
    ]


async def measure(
    targets: list[Target], levels: Sequence[int], sequential: int, tokens: int
) -> tuple[list[list[str]], list[list[str]]]:
    for t in targets:
        await t.open()
        await t.sequential(3)  # warm-up: first-request costs out of the figures
    setup: dict[str, dict[str, list[dict[str, Any]]]] = {t.label: {} for t in targets}
    for _ in range(ROUNDS):  # the servers alternate, so that a busier minute hits both
        for t in targets:
            for kind, samples in (await t.sequential(-(-sequential // ROUNDS))).items():
                setup[t.label].setdefault(kind, []).extend(samples)
    setup_rows = [
        setup_row(kind, label, setup[label][kind])
        for kind in setup[targets[0].label]
        for label in setup
    ]
    burst_rows = []
    for n in levels:
        for t in targets:
            rep = await t.burst(n, tokens)
            burst_rows.append(burst_row(rep))
            print(f"  burst of {n}, {t.label}: done", flush=True)
    for t in targets:
        await t.client.aclose()
    return setup_rows, burst_rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="64,256")
    parser.add_argument("--sequential", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=100, help="burst replies' length")
    parser.add_argument("--baseline-rev", default="12bc48f")
    parser.add_argument("--database-url", help="a PostgreSQL server: a database per server")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x]
    most = max(levels)
    servers: list[tuple[so.Server, str]] = []
    with tempfile.TemporaryDirectory(prefix="setup-cost-") as tmp:
        base = export_tree(args.baseline_rev, Path(tmp) / "baseline")
        targets = []
        try:
            for label, tree in ((f"before ({args.baseline_rev})", base), ("this tree", so.ROOT)):
                folder = Path(tmp) / ("base" if tree == base else "new")
                folder.mkdir()
                if args.database_url:
                    url = asyncio.run(create_database(args.database_url))
                else:
                    url = so.sqlite_url(folder)
                server = serve(tree, url, folder, most, args.tokens)
                servers.append((server, url))
                targets.append(Target(label, server, url))
            setup_rows, burst_rows = so.run_loop(
                measure(targets, levels, args.sequential, args.tokens)
            )
        finally:
            for (server, url), target in zip(servers, targets, strict=False):
                server.stop()
                if server.errors():
                    print(f"{target.label}:")
                server.print_errors()
                if args.database_url:
                    asyncio.run(drop_database(url, args.database_url))
    database = "PostgreSQL" if args.database_url else "SQLite"
    print(
        f"\n{database}, synthetic engine; {os.cpu_count()} CPUs. Set-up per request, one at a "
        f"time ({args.sequential} of each), measured in the server from arrival to response start:"
    )
    so.print_table(
        [
            "request",
            "code",
            "ok",
            "loop CPU p50 us",
            "mean us",
            "wall p50 us",
            "statements",
            "transactions",
            "checkouts",
        ],
        setup_rows,
    )
    print(f"\nBursts of page streams ({args.tokens}-token replies), opened at once:")
    so.print_table(
        [
            "streams",
            "code",
            "ok",
            "TTFT p50 ms",
            "engine TTFT p50",
            "added p50",
            "added p99",
            "headers p50 ms",
            "headers max",
            "loop CPU ms/stream",
            "loop busy",
        ],
        burst_rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
