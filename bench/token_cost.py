"""What one streamed token costs the server's event loop, against an older revision in the same run.

    python bench/token_cost.py [--levels 8,32] [--tokens 400] [--rounds 3] [--step-ms 20]
        [--transports sse,openai] [--engine synthetic|llamacpp] [--baseline-rev REV]

On a CPU every microsecond the event loop spends per token is taken from the engine's compute
threads (issue 12). This measures that cost alone, by default with the synthetic engine (no
maths: its step is a sleep), so nothing but the serving path runs: the engine's hand-off, the
pump, the subscriber, the framing, Litestar's response and uvicorn's write. `--engine llamacpp`
measures the same beside SmolLM2's two compute threads (asked for long stories; `--tokens` is
then their max_tokens and `--step-ms` means nothing), where every microsecond costs more.

Two servers (this tree and `--baseline-rev`, exported with `git archive`), each with its own
SQLite database, take turns over `--rounds` rounds. In each round, for each transport (the page's
SSE, OpenAI's `/v1` SSE) and each level N, N streams of `--tokens` tokens are opened at once and
read to their end. Over the steady part of the burst, from the moment every stream has had its
first token to the first stream's end (no set-up, no end in it), the event-loop thread's CPU
(schedstat, ns) divided by the delta events the client received is the loop's CPU per token.
The once-a-second progress flush falls in that span too, as it does in service. With steps of
`--step-ms` the loop keeps up (its busy share is printed), so each event is one token.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import serving_overhead as so  # bench/ is on sys.path when this script runs
from final_save import export_tree
from setup_cost import api_key, model_name

TRANSPORTS = ("sse", "openai")


def loop_cpu_s(pid: int) -> float:
    """The event-loop thread's CPU time, in ns resolution (schedstat's time on CPU; /proc's
    stat counts in 10 ms ticks, too coarse for a burst)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def serve(
    tree: Path, folder: Path, most: int, tokens: int, step_ms: float, engine: str = "synthetic"
) -> so.Server:
    folder.mkdir(parents=True, exist_ok=True)
    env = {"ENGINE": engine, "DATABASE_URL": so.sqlite_url(folder), "DATA_DIR": str(folder)}
    if engine == "synthetic":
        env |= {
            "ENGINE_MAX_SEQS": str(most),
            "ENGINE_KV_CELLS": str(most * (tokens + 256) + 4096),
            "SYNTHETIC_STEP_MS": str(step_ms),
            "SYNTHETIC_PER_SEQ_MS": "0",
        }
    server = so.Server(env, folder / "server.log")
    server.cwd = tree
    return server.start()


class Target:
    """One server, its logged-in client, and conversations to send into."""

    def __init__(self, label: str, server: so.Server, engine: str = "synthetic") -> None:
        self.label, self.server = label, server
        # SmolLM2 (ENGINE=llamacpp) is asked for long stories: its replies end when it decides
        self.content = so.synthetic_content if engine == "synthetic" else lambda _: so.llama_content
        self.client = so.new_client(server.url)
        self.key = self.model = ""
        self.conversations: list[str] = []

    async def open(self) -> None:
        await so.signup(self.client)
        self.key = await api_key(self.client)
        self.model = await model_name(self.client, self.key)

    def request(
        self, transport: str, i: int, tokens: int
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        content = self.content(tokens)(i)
        if transport == "sse":
            return (
                f"/api/conversations/{self.conversations[i]}/messages",
                so.message_body(content, tokens + 10),
                so.csrf(self.client),
            )
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": tokens + 10,
            "stream": True,
        }
        return "/v1/chat/completions", body, {"authorization": f"Bearer {self.key}"}

    async def burst(self, transport: str, n: int, tokens: int) -> tuple[float, int, float]:
        """n streams at once, read to their ends. Over the steady part (from every stream's first
        token to the first stream's end): (the loop's CPU seconds, delta events, seconds)."""
        delta_line = "event: delta" if transport == "sse" else 'data: {"id"'
        window: dict[str, Any] = {"events": 0, "started": 0, "at": None, "to": None}
        if transport == "sse":  # fresh chats: a reply in one with history would need more cells
            self.conversations = await so.new_conversations(self.client, n)

        def mark() -> tuple[float, int, float]:
            return loop_cpu_s(self.server.pid), window["events"], time.monotonic()

        async def one(i: int) -> None:
            url, body, headers = self.request(transport, i, tokens)
            first = True
            async with self.client.stream("POST", url, json=body, headers=headers) as r:
                if r.status_code != 200:
                    raise RuntimeError(
                        f"{url} answered {r.status_code}: {(await r.aread())[:300]!r}"
                    )
                async for line in r.aiter_lines():
                    if line.startswith(delta_line) and (
                        transport == "sse" or '"content":"' in line
                    ):
                        window["events"] += 1
                        if first:
                            first = False
                            window["started"] += 1
                            if window["started"] == n:
                                window["at"] = mark()
            if window["to"] is None:
                window["to"] = mark()

        await asyncio.gather(*(one(i) for i in range(n)))
        await asyncio.sleep(0.2)  # the ends' saves
        if window["at"] is None or window["at"][2] > window["to"][2]:
            raise RuntimeError("a stream ended before every stream had its first token")
        (cpu0, events0, t0), (cpu1, events1, t1) = window["at"], window["to"]
        return cpu1 - cpu0, events1 - events0, t1 - t0


async def measure(
    targets: Sequence[Target],
    levels: Sequence[int],
    tokens: int,
    rounds: int,
    transports: Sequence[str],
) -> dict[tuple[str, str, int], list[float]]:
    """(label, transport, level) -> the loop's µs per token, one per round."""
    out: dict[tuple[str, str, int], list[float]] = {}
    try:
        for t in targets:
            await t.open()
            for transport in transports:  # warm: imports, caches, the first connections
                await t.burst(transport, 4, 20)
        for r in range(rounds):
            for transport in transports:
                for n in levels:
                    for t in targets if r % 2 == 0 else list(reversed(targets)):
                        cpu_s, events, window_s = await t.burst(transport, n, tokens)
                        per_token_us = cpu_s / max(1, events) * 1e6
                        out.setdefault((t.label, transport, n), []).append(per_token_us)
                        print(
                            f"  round {r + 1} {t.label:>9} {transport:>6} x{n:<3} "
                            f"{per_token_us:7.1f} µs/token  ({events} events in {window_s:.2f} s, "
                            f"loop busy {cpu_s / window_s:.0%})",
                            flush=True,
                        )
        return out
    finally:
        for t in targets:
            await t.client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--levels", default="8,32")
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=20.0, help="the synthetic engine's step")
    p.add_argument("--transports", default="sse,openai")
    p.add_argument(
        "--engine",
        default="synthetic",
        help="llamacpp: SmolLM2 on the CPU, the loop's cost beside the compute threads",
    )
    p.add_argument("--baseline-rev", default="HEAD")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    transports = [x for x in args.transports.split(",") if x in TRANSPORTS]
    with tempfile.TemporaryDirectory(prefix="token-cost-") as tmp:
        work = Path(tmp)
        base_tree = export_tree(args.baseline_rev, work / "baseline-tree")
        servers = {
            "this tree": serve(
                so.ROOT, work / "this", max(levels), args.tokens, args.step_ms, args.engine
            ),
            args.baseline_rev: serve(
                base_tree, work / "baseline", max(levels), args.tokens, args.step_ms, args.engine
            ),
        }
        targets = [Target(label, server, args.engine) for label, server in servers.items()]
        print(
            f"2 servers ({args.engine} engine, {args.step_ms} ms steps), {args.tokens}-token "
            f"replies, {args.rounds} rounds; client loop: {so.loop_name()}"
        )
        try:
            results = so.run_loop(measure(targets, levels, args.tokens, args.rounds, transports))
        finally:
            for t in targets:
                t.server.print_errors()
                t.server.stop()
    rows = []
    for transport in transports:
        for n in levels:
            this = statistics.median(results[("this tree", transport, n)])
            base = statistics.median(results[(args.baseline_rev, transport, n)])
            rows.append([transport, str(n), f"{base:.1f}", f"{this:.1f}", so.ratio(this, base)])
    print(f"\nthe event loop's CPU per streamed token, median of {args.rounds} rounds (µs):")
    so.print_table(["transport", "streams", args.baseline_rev, "this tree", "ratio"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
