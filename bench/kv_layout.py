"""The llama.cpp engine's KV layouts side by side: one unified pool against a stream per sequence.

    .venv/bin/python bench/kv_layout.py [--levels 1,8,32] [--max-tokens 128] [--reps 2] [--greedy]

Each repetition runs, for each level N, N requests at once (sampled at temperature 0.7 with
min-p 0.05, or greedy) on two engines built in turn (alternating which goes first), each as an
operator would set it up for N streams: `ENGINE_KV_LAYOUT=unified` (any sequence in any cell,
16,384 cells; llama.cpp cuts a step with `split_simple`, and its prefix cache shares cells in the
pool) and `ENGINE_KV_LAYOUT=streams` (a stream of 2,048 cells per sequence, as llama-server's
`--parallel N --ctx-size N*2048`; llama.cpp cuts with `split_equal(sequential)`, and its prefix
cache keeps saved states in host memory). Both caches on. Aggregate completion tokens over wall
time, and the step gap.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import EngineSettings
from bench.engine_throughput import requests

STREAM_CELLS = 2048


async def one_run(
    unified: bool, n: int, max_tokens: int, tag: str, greedy: bool
) -> tuple[float, float, int]:
    from app.engine.base import Finished, SamplingParams, TextDelta
    from app.engine.llamacpp.engine import LlamaCppEngine

    settings = (
        EngineSettings(max_seqs=max(n, 2), kv_cells=16384, kv_layout="unified")
        if unified
        else EngineSettings(
            max_seqs=max(n, 2), kv_cells=max(n, 2) * STREAM_CELLS, kv_layout="streams"
        )
    )
    engine = LlamaCppEngine(settings)
    await engine.start()
    try:
        params = (
            SamplingParams(max_tokens=max_tokens, temperature=0.0)
            if greedy
            else SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=1, min_p=0.05)
        )
        gaps: list[float] = []

        async def reply(i: int, messages: list[dict[str, str]]) -> Finished:
            last: float | None = None
            async for event in engine.generate(f"{tag}-{i}", messages, params):
                if isinstance(event, TextDelta):
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                else:
                    return event
            raise AssertionError("no Finished")

        await reply(-1, requests(1, f"warm{tag}")[0])
        t0 = time.perf_counter()
        done = await asyncio.gather(*(reply(i, m) for i, m in enumerate(requests(n, tag))))
        wall = time.perf_counter() - t0
        tokens = sum(f.completion_tokens for f in done)
        return tokens / wall, statistics.median(gaps) * 1000, tokens
    finally:
        await engine.shutdown()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--levels", default="8,32")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--greedy", action="store_true", help="greedy replies (exact steps)")
    args = parser.parse_args()
    results: dict[tuple[int, bool], list[tuple[float, float, int]]] = {}
    for rep in range(args.reps):
        for n in (int(x) for x in args.levels.split(",")):
            order = (True, False) if (rep + n) % 2 == 0 else (False, True)
            for unified in order:
                figures = await one_run(unified, n, args.max_tokens, f"{rep}.{n}", args.greedy)
                results.setdefault((n, unified), []).append(figures)
                layout = "unified" if unified else "streams"
                print(
                    f"rep {rep + 1} n={n:<3} {layout:8} {figures[0]:7.1f} tok/s  "
                    f"gap p50 {figures[1]:6.1f} ms  ({figures[2]} tokens)",
                    flush=True,
                )
    print(f"\n{'n':>4} {'unified tok/s':>14} {'streams tok/s':>14} {'streams/unified':>16}")
    for n in sorted({n for n, _ in results}):
        u = statistics.median(r[0] for r in results[(n, True)])
        s = statistics.median(r[0] for r in results[(n, False)])
        print(f"{n:>4} {u:>14.1f} {s:>14.1f} {s / u:>15.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
