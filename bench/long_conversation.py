"""A long conversation past the context: the stepped window against one that moves every send.

    python bench/long_conversation.py [--turns 16] [--context 2048] [--max-tokens 300]

One conversation of N turns (SmolLM2 on llama.cpp, greedy, replies asked for in about 100 words,
max_tokens 300), with ENGINE_CONTEXT small enough that the history overflows it several times.
Each turn is sent three ways, one after the other, so the three share the machine's load:

- (a) stepped: the page API (SSE); the server fits the history with its stepped window
  (app/domain/chat/prompts/window.py): the start stays put while the history fits, then moves
  to about half the room, so the next turns share a prefix the engine's prefix cache holds.
- (b) one turn: a second server of the same app (the two prefix caches, each capped at an eighth
  of the KV pool, must not evict each other's entries), through `/v1/chat/completions`, given
  what a client that drops as few of the oldest turns as it must sends (bench/one_turn_client.py):
  the same system prompt, history (the page's, with its stored token counts) and room (the
  conversation's `context.max_message_tokens`).
- (c) llama-server: llama.cpp's own server (tests/llama_server.py: one slot of the same context,
  2 threads, its prompt cache on by default) given (b)'s messages.

(b) and (c) ask for one token (max_tokens 1): TTFT is what they are compared on, and their history
is (a)'s. So their cache holds the previous prompt without its reply: on a turn where the one-turn
window did not move a real client would also reuse the reply (the summary counts such turns). Per turn: TTFT at the
client (request sent to first text), prompt tokens, and prefilled tokens (prompt less the prefix
reused: the app's `prefix_reused_tokens` engine counter from `/admin/api/engine`, before and
after; llama-server's own `timings.prompt_n` / `cache_n` in its last chunk).

Printed: a row per turn (with the load average: the machine may be shared), then for the turns
from the first overflow on TTFT and prefilled tokens, p50 and mean, and the ratios stepped / one
turn (target <= 0.5) and stepped / llama-server (target <= 0.7).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from serving_overhead import (  # bench/ is on sys.path when this script runs
    ROOT,
    Server,
    csrf,
    new_client,
    print_table,
    run_loop,
    signup,
    sqlite_url,
    stream_reply,
)

sys.path.insert(0, str(ROOT))

from one_turn_client import one_turn_messages, split_turns  # bench/, as serving_overhead

from tests.llama_server import LlamaServer

THREADS = 2
SYSTEM_PROMPT = "You are a helpful assistant. Answer every question in about 100 words."
TOPICS = (
    "how lighthouses work; the history of bread; why the sky is blue; how bees make honey; "
    "the life of a river; how trains are signalled; the first telescopes; how glaciers move; "
    "what a harbour pilot does; how copper is mined; the making of paper; why cats purr"
).split("; ")
ANGLES = ("Tell me about", "Explain", "Describe", "Give me the story of", "Teach a child")


def question(turn: int) -> str:
    """The turn's question: a topic and an angle, never the same pair twice in 60 turns."""
    topic = TOPICS[turn % len(TOPICS)]
    angle = ANGLES[(turn // len(TOPICS)) % len(ANGLES)]
    return f"{angle} {topic}."


def p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- one turn, three ways -------------------------------------------------------------------------


@dataclass
class Shot:
    """One request as the client saw it, with its server's prefill."""

    ttft_ms: float | None = None
    prompt_tokens: int | None = None
    prefilled: int | None = None
    window: int | None = None  # the index of the first turn in the prompt
    error: str | None = None


@dataclass
class Turn:
    n: int
    reply_tokens: int = 0
    shots: dict[str, Shot] = field(default_factory=dict)


async def reused(admin: httpx.AsyncClient) -> float:
    r = await admin.get("/admin/api/engine")
    r.raise_for_status()
    return r.json()["extra"]["prefix_reused_tokens"]


async def openai_stream(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]
) -> tuple[Shot, dict[str, Any]]:
    """A streamed chat completion: TTFT, usage, and llama-server's `timings` if it sends them."""
    shot, timings, sent = Shot(), {}, time.perf_counter()
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            shot.error = f"http {response.status_code}: {(await response.aread())[:200]!r}"
            return shot, timings
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if shot.ttft_ms is None and any(
                (c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()
            ):
                shot.ttft_ms = (time.perf_counter() - sent) * 1000
            if usage := chunk.get("usage"):
                shot.prompt_tokens = usage.get("prompt_tokens")
            timings = chunk.get("timings") or timings
    return shot, timings


@dataclass
class Bench:
    page: httpx.AsyncClient  # user 1, the app's admin: the page conversation and engine stats
    other: httpx.AsyncClient  # the second app server's admin, with a /v1 key: the one turn
    other_headers: dict[str, str]
    llama: httpx.AsyncClient | None  # None: --skip-llama-server
    model: str
    conversation: str

    async def stepped(self, turn: Turn) -> None:
        before = await reused(self.page)
        result = await stream_reply(self.page, self.conversation, question(turn.n))
        final = result.final or {}
        shot = turn.shots["stepped"] = Shot(error=result.error or final.get("error"))
        shot.ttft_ms = None if result.ttft_s is None else result.ttft_s * 1000
        shot.prompt_tokens = (final.get("usage") or {}).get("prompt_tokens")
        turn.reply_tokens = (final.get("usage") or {}).get("completion_tokens") or 0
        if shot.prompt_tokens is not None:
            shot.prefilled = shot.prompt_tokens - int(await reused(self.page) - before)

    async def fitted(self, turn: Turn) -> list[dict[str, str]]:
        """(b)'s messages for this turn, from the page conversation as stored; also where (a)'s
        window began, in turns."""
        r = await self.page.get(f"/api/conversations/{self.conversation}", params={"limit": 500})
        r.raise_for_status()
        shown = r.json()
        messages = shown["messages"]
        reply, asked = messages[-1], messages[-2]
        history = messages[:-2]
        turns = split_turns(history)
        firsts = {t[0]["id"]: i for i, t in enumerate(turns)}
        start_id = reply.get("window_start_id")
        turn.shots["stepped"].window = 0 if start_id is None else firsts.get(start_id, len(turns))
        fitted, start = one_turn_messages(
            history, asked, shown["context"]["max_message_tokens"], SYSTEM_PROMPT
        )
        turn.shots["one turn"] = Shot(window=start)
        turn.shots["llama-server"] = Shot(window=start)
        return fitted

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "seed": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def one_turn(self, turn: Turn, messages: list[dict[str, str]]) -> None:
        before = await reused(self.other)
        shot, _ = await openai_stream(
            self.other, "/v1/chat/completions", self.other_headers, self.body(messages)
        )
        shot.window = turn.shots["one turn"].window
        if shot.prompt_tokens is not None:
            shot.prefilled = shot.prompt_tokens - int(await reused(self.other) - before)
        turn.shots["one turn"] = shot

    async def llama_server(self, turn: Turn, messages: list[dict[str, str]]) -> None:
        if self.llama is None:
            return
        shot, timings = await openai_stream(
            self.llama, "/v1/chat/completions", {}, self.body(messages)
        )
        shot.window = turn.shots["llama-server"].window
        if "prompt_n" in timings:
            shot.prefilled = int(timings["prompt_n"])
            shot.prompt_tokens = shot.prefilled + int(timings.get("cache_n") or 0)
        turn.shots["llama-server"] = shot

    async def turn(self, n: int) -> Turn:
        turn = Turn(n)
        await self.stepped(turn)
        messages = await self.fitted(turn)
        await self.one_turn(turn, messages)
        await self.llama_server(turn, messages)
        return turn


WAYS = ("stepped", "one turn", "llama-server")


async def user_key(client: httpx.AsyncClient) -> dict[str, str]:
    await signup(client)
    key = await client.post("/api/keys", json={"name": "bench"}, headers=csrf(client))
    key.raise_for_status()
    return {"Authorization": f"Bearer {key.json()['secret']}"}


async def measure(
    apps: tuple[Server, Server],
    llama: LlamaServer | None,
    args: argparse.Namespace,
    turns: list[Turn],
) -> None:
    """Run the conversation, appending each turn to `turns` (kept if the run fails)."""
    page, other = new_client(apps[0].url), new_client(apps[1].url)
    llama_client = (
        None
        if llama is None
        else httpx.AsyncClient(base_url=llama.url, timeout=httpx.Timeout(None, connect=60))
    )
    try:
        await signup(page)  # each database's first user: its admin, who reads the engine's stats
        headers = await user_key(other)
        models = await other.get("/v1/models", headers=headers)
        models.raise_for_status()
        r = await page.post("/api/conversations/", json={"title": "long"}, headers=csrf(page))
        r.raise_for_status()
        conversation = r.json()["id"]
        chosen = {"system_prompt": SYSTEM_PROMPT, "max_tokens": args.max_tokens}
        chosen |= {"temperature": 0.0, "seed": 1}
        url = f"/api/conversations/{conversation}/settings"
        (await page.put(url, json=chosen, headers=csrf(page))).raise_for_status()
        model = models.json()["data"][0]["id"]
        bench = Bench(page, other, headers, llama_client, model, conversation)
        for n in range(args.turns):
            turns.append(await bench.turn(n))
            print_turn(turns[-1])
    finally:
        await page.aclose()
        await other.aclose()
        if llama_client is not None:
            await llama_client.aclose()


def cell(shot: Shot) -> str:
    if shot.error:
        return f"error: {shot.error[:40]}"
    ttft = "-" if shot.ttft_ms is None else f"{shot.ttft_ms:,.0f}"
    return f"{ttft} ms / {shot.prefilled} of {shot.prompt_tokens} (w{shot.window})"


def print_turn(turn: Turn) -> None:
    cells = " | ".join(f"{way}: {cell(turn.shots[way])}" for way in WAYS)
    load = os.getloadavg()[0]
    print(f"turn {turn.n + 1:>2} reply {turn.reply_tokens:>3} tok | {cells} | load {load:.1f}")


def summary(turns: list[Turn]) -> bool:
    """The figures after the first overflow; True when a request failed."""
    first_overflow = next(
        (t.n for t in turns if t.shots["stepped"].window or t.shots["one turn"].window), None
    )
    ways = [w for w in WAYS if any(t.shots[w].ttft_ms or t.shots[w].error for t in turns)]
    failed = any(t.shots[w].error or t.shots[w].ttft_ms is None for t in turns for w in ways)
    if first_overflow is None:
        print("\nthe history never overflowed the context: run more turns")
        return failed
    after = [t for t in turns if t.n >= first_overflow]
    print(f"\n{len(after)} turns from the first overflow (turn {first_overflow + 1}) on:")
    rows, ttft = [], {}
    for way in ways:
        shots = [t.shots[way] for t in after]
        ttft[way] = p50([s.ttft_ms for s in shots if s.ttft_ms is not None])
        prefilled = [s.prefilled for s in shots if s.prefilled is not None]
        rows.append(
            [
                way,
                f"{ttft[way]:,.0f}",
                f"{statistics.fmean([s.ttft_ms for s in shots if s.ttft_ms is not None]):,.0f}",
                f"{p50(prefilled):,.0f}",
                f"{statistics.fmean(prefilled):,.0f}" if prefilled else "-",
                f"{p50([s.prompt_tokens for s in shots if s.prompt_tokens]):,.0f}",
                str(len({s.window for s in shots})),
            ]
        )
    print_table(
        [
            "window",
            "TTFT p50 ms",
            "TTFT mean ms",
            "prefilled p50",
            "prefilled mean",
            "prompt p50",
            "window starts",
        ],
        rows,
    )
    still = sum(
        1
        for a, b in itertools.pairwise(after)
        if a.shots["one turn"].window == b.shots["one turn"].window
    )
    targets = {"one turn": 0.5, "llama-server": 0.7}
    ratios = [
        f"stepped / {way}: {ttft['stepped'] / ttft[way]:.2f}x (target <= {target})"
        for way, target in targets.items()
        if way in ttft
    ]
    print(f"{'; '.join(ratios)}; turns where the one-turn window did not move: {still}")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=16, help="the issue's figure is 60")
    parser.add_argument("--context", type=int, default=2048, help="ENGINE_CONTEXT for both")
    parser.add_argument("--max-tokens", type=int, default=300, help="each page reply's limit")
    parser.add_argument("--skip-llama-server", action="store_true", help="(a) and (b) only")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-long-conversation-"))
    started = time.monotonic()
    app_env = {
        "ENGINE": "llamacpp",
        "ENGINE_THREADS": str(THREADS),
        "ENGINE_CONTEXT": str(args.context),
        "DATA_DIR": str(work),
        "DATABASE_URL": sqlite_url(work),
    }
    (work / "one-turn").mkdir()
    one_turn_env = {
        **app_env,
        "DATA_DIR": str(work / "one-turn"),
        "DATABASE_URL": sqlite_url(work / "one-turn"),
    }
    apps = (Server(app_env, work / "app.log"), Server(one_turn_env, work / "app-one-turn.log"))
    llama = (
        None
        if args.skip_llama_server
        else LlamaServer(
            work / "llama-server.log", parallel=1, slot_context=args.context, threads=THREADS
        )
    )
    print(
        f"{args.turns} turns, ENGINE_CONTEXT {args.context}, replies up to {args.max_tokens} "
        f"tokens, greedy; {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; work folder {work}"
    )
    print("each cell: TTFT / prefilled of prompt tokens (w: the first turn the prompt kept)")
    turns: list[Turn] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: still stop and summarise
    failed = True
    try:
        for app in apps:
            app.start()
        if llama is not None:
            llama.start()
        run_loop(measure(apps, llama, args, turns))
    finally:
        for app in apps:
            app.stop()
            app.print_errors()
        if llama is not None:
            llama.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        failed = summary(turns) or len(turns) < args.turns
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\ntotal {time.monotonic() - started:.0f} s, load average {load}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
