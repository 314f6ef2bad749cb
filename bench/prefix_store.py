"""Where the unified pool's prefix cache keeps prefixes: host memory against the pool's own cells.

    .venv/bin/python bench/prefix_store.py [--reps 1] [--users 16] [--turns 6] [--waves 4]

The llama.cpp engine alone (SmolLM2, 2 threads, `ENGINE_KV_LAYOUT=unified` with 64 sequence ids
and 16,384 cells, sampled at temperature 0.7), built once per store and repetition, alternating
which goes first:

- `ENGINE_PREFIX_CACHE_STORE=host`: a finished sequence's state is copied to host memory and
  copied back into a new sequence whose prompt starts the same way (`host_cache`);
- `ENGINE_PREFIX_CACHE_STORE=pool`: its cells stay in the pool under a sequence id of their own
  and are shared by tagging (`prefix_cache`, at most 8 entries and an eighth of the pool).

Two workloads on each:

- multi-turn: `--users` owners, each a conversation of `--turns` turns (48 tokens a reply, 0.2-1 s
  of thinking between turns), all at once: aggregate tok/s, time to first token of first and of
  later turns (a later turn's prompt is the last one plus the reply and a new question: a hit);
- mixed traffic: `--waves` waves of 12 requests from 40 owners, prompts of 20 to 900 words,
  replies of 16 to 96 tokens, arriving over ~2 s: the KV window a query walks (llama.cpp's n_kv,
  `EngineStats.kv_walked`) against the cells the running sequences hold, sampled every 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import EngineSettings

TOPICS = ["bread", "the sea", "a robot", "lighthouses", "cats", "the moon", "trains", "gardens"]
WORDS = "river harvest engine lantern market winter signal garden copper village ledger".split()


def build(store: str):
    from app.engine.llamacpp.engine import LlamaCppEngine

    return LlamaCppEngine(
        EngineSettings(max_seqs=64, kv_cells=16384, threads=2, prefix_cache_store=store)
    )


class Sampler:
    """(walked, used) every 50 ms while anything runs."""

    def __init__(self, engine) -> None:
        self.engine, self.samples, self._stop = engine, [], False

    async def run(self) -> None:
        while not self._stop:
            s = self.engine.stats()
            if s.running:
                self.samples.append((s.kv_walked or 0, s.kv_used))
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        self._stop = True


async def multi_turn(store: str, users: int, turns: int, seed: int) -> dict[str, float]:
    from app.engine.base import Finished, SamplingParams, TextDelta

    engine = build(store)
    await engine.start()
    ttft: dict[str, list[float]] = {"first": [], "later": []}
    tokens = 0

    async def user(u: int) -> None:
        nonlocal tokens
        rng = random.Random(seed * 1000 + u)
        messages = [{"role": "system", "content": f"You are helper {u}."}]
        for turn in range(turns):
            question = f"Tell me something new about {rng.choice(TOPICS)} (turn {turn})."
            messages.append({"role": "user", "content": question})
            sent, first, text = time.perf_counter(), None, []
            params = SamplingParams(max_tokens=48, temperature=0.7)
            async for event in engine.generate(
                f"u{u}t{turn}", list(messages), params, owner=f"o{u}"
            ):
                if isinstance(event, TextDelta):
                    first = first or time.perf_counter() - sent
                    text.append(event.text)
                elif isinstance(event, Finished):
                    tokens += event.completion_tokens
            ttft["first" if turn == 0 else "later"].append(first or 0.0)
            messages.append({"role": "assistant", "content": "".join(text)})
            await asyncio.sleep(rng.uniform(0.2, 1.0))

    try:
        started = time.perf_counter()
        await asyncio.gather(*(user(u) for u in range(users)))
        wall = time.perf_counter() - started
        cache = engine.stats().prefix_cache
    finally:
        await engine.shutdown()
    later = sorted(ttft["later"])
    return {
        "tok/s": tokens / wall,
        "first TTFT p50 ms": 1000 * statistics.median(ttft["first"]),
        "later TTFT p50 ms": 1000 * statistics.median(later),
        "later TTFT p90 ms": 1000 * later[int(0.9 * len(later))],
        "hits": cache.hits if cache else 0,
        "reused tokens": cache.reused_tokens if cache else 0,
    }


async def mixed_traffic(store: str, waves: int, seed: int) -> list[tuple[float, float]]:
    from app.engine.base import SamplingParams
    from tests.engine.streams import collect

    engine = build(store)
    await engine.start()
    sampler = Sampler(engine)
    sampling = asyncio.create_task(sampler.run())
    rng = random.Random(seed)
    rows = []
    try:
        n = 0
        for _ in range(waves):
            tasks = []
            for _ in range(12):
                n += 1
                text = " ".join(
                    rng.choice(WORDS) for _ in range(rng.choice([20, 40, 80, 300, 900]))
                )
                params = SamplingParams(max_tokens=rng.choice([16, 48, 96]), temperature=0.7)
                reply = engine.generate(
                    f"r{n}",
                    [{"role": "user", "content": text}],
                    params,
                    owner=f"u{rng.randrange(40)}",
                )
                tasks.append(asyncio.create_task(collect(reply)))
                await asyncio.sleep(rng.random() * 0.3)
            mark = len(sampler.samples)
            await asyncio.gather(*tasks)
            wave = sampler.samples[mark:] or sampler.samples[-1:]
            rows.append(
                (statistics.median(w for w, _ in wave), statistics.median(u for _, u in wave))
            )
    finally:
        sampler.stop()
        await sampling
        await engine.shutdown()
    return rows


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--waves", type=int, default=4)
    args = p.parse_args()
    for rep in range(args.reps):
        order = ("host", "pool") if rep % 2 == 0 else ("pool", "host")
        print(f"\n== repetition {rep + 1}: multi-turn, {args.users} users x {args.turns} turns")
        for store in order:
            figures = await multi_turn(store, args.users, args.turns, seed=rep + 1)
            print(f"{store:>5}: " + "; ".join(f"{k} {v:.0f}" for k, v in figures.items()))
        print(f"\n== repetition {rep + 1}: mixed traffic, walked / used cells (median per wave)")
        for store in order:
            rows = await mixed_traffic(store, args.waves, seed=rep + 1)
            print(f"{store:>5}: " + ", ".join(f"{w:.0f} / {u:.0f}" for w, u in rows))


if __name__ == "__main__":
    asyncio.run(main())
