"""Conversations of several turns, many users at once: this app's prefix cache against llama-server's.

    python bench/multi_turn.py [--users 16] [--turns 8] [--think-s 1,3] [--max-tokens 64]
        [--runs 1] [--app-env NAME=VALUE ...]

Each of `--users` users holds one conversation of `--turns` turns: it sends its history plus a new
question (streamed, sampled at temperature 0.8), appends the reply, thinks for a random time in
`--think-s`, and goes on; users start a second apart. Every turn's prompt is the previous turn's
prompt plus its reply plus a question, so a server that keeps each conversation's KV cells (or a
saved copy of them) prefills only the new part; one that does not prefills it all.

- this app (uvicorn, as bench/vs_llama_server.py starts it): each user signs up and calls `/v1`
  with its own API key, so each conversation is a different owner of the engine's prefix cache;
  by default ENGINE_KV_LAYOUT=streams with llama-server's slot count and context (ENGINE_MAX_SEQS
  = 32, ENGINE_KV_CELLS = 32 x 2,048) and its host-memory cache at its default bound.
- llama-server: `--parallel 32`, 2,048 tokens a slot, its defaults otherwise: prompt caching on,
  `--cache-ram` 8 GiB, idle slots saved to it (common/common.h, tools/server/server-context.cpp).

Printed per target: TTFT p50/p90 of the first turns and of the later ones, prompt tokens, tok/s;
then app / llama-server. The two workloads run one after the other (the order alternates by run);
both servers stay up throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from serving_overhead import (
    ROOT,
    Server,
    fmt,
    median,
    pct,
    print_table,
    ratio,
    run_loop,
    sqlite_url,
)
from vs_llama_server import SLOT_CONTEXT, THREADS, Stream, Target, app_target, stream_chat

sys.path.insert(0, str(ROOT))

from app.engine.llamacpp.model_files import resolve_model_path
from tests.llama_server import LlamaServer

SLOTS = 32
TOPICS = (
    "lighthouses",
    "bread",
    "volcanoes",
    "honeybees",
    "the moon",
    "trains",
    "glaciers",
    "chess",
)
FOLLOW_UPS = (
    "Tell me more about that.",
    "Why is that so?",
    "Give me an example.",
    "What is surprising about it?",
    "How did people learn this?",
    "Summarise what we said so far.",
    "What should I read next?",
)


async def user_targets(server: Server, users: int) -> list[Target]:
    """One signed-up user with an API key per conversation (each an owner of its own cache)."""
    return [await app_target(server) for _ in range(users)]


async def conversation(
    client: httpx.AsyncClient, target: Target, user: int, args: argparse.Namespace, seed: int
) -> list[Stream]:
    rng = random.Random(seed * 1000 + user)
    low, high = (float(x) for x in args.think_s.split(","))
    await asyncio.sleep(user * 1.0)
    messages = [
        {"role": "user", "content": f"[user {user}, {seed}] Tell me about {TOPICS[user % 8]}."}
    ]
    turns = []
    for turn in range(args.turns):
        body = {
            "model": target.model,
            "messages": messages,
            "max_tokens": args.max_tokens,
            "temperature": 0.8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out = await stream_chat_text(client, target, body)
        turns.append(out[0])
        if out[0].error:
            print(f"user {user} turn {turn + 1}: {out[0].error}", flush=True)
        messages = [
            *messages,
            {"role": "assistant", "content": out[1]},
            {"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]},
        ]
        await asyncio.sleep(rng.uniform(low, high))
    return turns


async def stream_chat_text(
    client: httpx.AsyncClient, target: Target, body: dict[str, Any]
) -> tuple[Stream, str]:
    """`stream_chat`, keeping the reply's text for the next turn's history."""
    texts: list[str] = []
    stream = await stream_chat(client, target, body, texts)
    return stream, "".join(texts)


async def workload(
    targets: list[Target], args: argparse.Namespace, seed: int
) -> list[list[Stream]]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        return list(
            await asyncio.gather(
                *(conversation(client, t, u, args, seed) for u, t in enumerate(targets))
            )
        )


def report(name: str, convs: list[list[Stream]]) -> dict[str, float | None]:
    first = [c[0].ttft_ms for c in convs if c and c[0].ttft_ms is not None]
    later = [s.ttft_ms for c in convs for s in c[1:] if s.ttft_ms is not None]
    streams = [s for c in convs for s in c]
    wall = max(s.end for s in streams) - min(s.sent for s in streams)
    errors = sum(1 for s in streams if s.error)
    return {
        "first p50": median(first),
        "later p50": median(later),
        "later p90": pct(later, 0.9),
        "prompt tok (last turn p50)": median([float(c[-1].prompt_tokens or 0) for c in convs]),
        "tok/s": sum(s.tokens for s in streams) / wall,
        "errors": float(errors),
    }


async def measure(
    app: Server, llama: LlamaServer, args: argparse.Namespace
) -> dict[str, list[dict[str, float | None]]]:
    results: dict[str, list[dict[str, float | None]]] = {"app": [], "llama-server": []}
    app_targets = await user_targets(app, args.users)
    llama_target = Target("llama-server", llama.openai_url, {}, "smollm2")
    for run in range(args.runs):
        order = ["app", "llama-server"] if run % 2 == 0 else ["llama-server", "app"]
        for name in order:
            targets = app_targets if name == "app" else [llama_target] * args.users
            t0 = time.perf_counter()
            convs = await workload(targets, args, seed=run * 2 + (name == "app"))
            figures = report(name, convs)
            results[name].append(figures)
            print(
                f"run {run + 1} {name:12} {time.perf_counter() - t0:6.1f} s  "
                + "  ".join(f"{k} {fmt(v)}" for k, v in figures.items())
                + f"  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--think-s", default="1,3", help="think time between turns: low,high seconds")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--app-env", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench-multi-turn-"))
    app_env = {
        "ENGINE": "llamacpp",
        "ENGINE_THREADS": str(THREADS),
        "ENGINE_KV_LAYOUT": "streams",
        "ENGINE_MAX_SEQS": str(SLOTS),
        "ENGINE_KV_CELLS": str(SLOTS * SLOT_CONTEXT),
        "SIGNUP_MODE": "open",
        "SIGNUP_MAX_PER_ADDRESS": "1000",  # every user signs up from this one address
        "DATA_DIR": str(work),
        "DATABASE_URL": sqlite_url(work),
        **dict(item.split("=", 1) for item in args.app_env),
    }
    app = Server(app_env, work / "app.log")
    llama = LlamaServer(
        work / "llama-server.log",
        parallel=SLOTS,
        slot_context=SLOT_CONTEXT,
        threads=THREADS,
        model=resolve_model_path(None),
    )
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"app: {' '.join(f'{k}={v}' for k, v in app_env.items() if k.startswith('ENGINE'))}; "
        f"llama-server: --parallel {SLOTS} --ctx-size {SLOTS * SLOT_CONTEXT}; "
        f"{args.users} users x {args.turns} turns, max_tokens {args.max_tokens}"
    )
    try:
        app.start()
        llama.start()
        results = run_loop(measure(app, llama, args))
    finally:
        app.stop()
        llama.stop()
        app.print_errors()
        shutil.rmtree(work, ignore_errors=True)
    keys = list(results["app"][0])
    rows = []
    for key in keys:
        a = median([r[key] for r in results["app"] if r[key] is not None])
        b = median([r[key] for r in results["llama-server"] if r[key] is not None])
        rows.append([key, fmt(a), fmt(b), ratio(a, b)])
    print()
    print_table(["medians over runs", "app", "llama-server", "app / llama-server"], rows)
    return 1 if any(r["errors"] for rs in results.values() for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
