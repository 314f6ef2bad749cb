"""Aggregate decode throughput of the llama.cpp engine against llama-cpp-python serving one at a time.

    /work/venv/bin/python bench/engine_throughput.py [--max-tokens 64] [--levels 1,4,8,16]

Both sides load the same GGUF (SmolLM2-135M-Instruct unless MODEL_PATH says otherwise) with the same
thread count, and answer the same chat requests greedily with the same max_tokens, in the same run.

- baseline: `Llama.create_chat_completion`, the high-level API, serving the requests one after
  another (what you get without a batching engine). Its aggregate rate for N requests is their total
  completion tokens over the sum of their times.
- engine: `LlamaCppEngine`, all N requests submitted at once; total completion tokens over the wall
  time until the last one finishes.

Tokens/s counts completion tokens only, end to end (prefill included), as a client sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.base import Finished, SamplingParams
from app.engine.llamacpp import LlamaCppEngine
from app.engine.model_files import resolve_model_path
from app.settings import EngineSettings

TOPICS = [
    "a lighthouse keeper",
    "a robot learning to paint",
    "the history of bread",
    "a city under the sea",
    "a dragon who fears fire",
    "the first day of school",
    "a journey across a desert",
    "an old clock that runs backwards",
    "a cat who becomes mayor",
    "the last tree on a mountain",
    "a library that never closes",
    "a storm at sea",
    "a detective who solves small mysteries",
    "a garden on the moon",
    "a musician who lost her hearing",
    "a train that never stops",
]


def requests(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Write a long, detailed story about {TOPICS[i % 16]}."}]
        for i in range(n)
    ]


def run_baseline(model_path: str, threads: int, max_tokens: int, n: int) -> list[tuple[int, float]]:
    """(completion tokens, seconds) for each request, served one after another."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=model_path,
        n_ctx=2048,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    llm.create_chat_completion(requests(1)[0], max_tokens=8, temperature=0.0)  # warm-up
    out = []
    for messages in requests(n):
        t0 = time.perf_counter()
        reply = llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0)
        out.append((reply["usage"]["completion_tokens"], time.perf_counter() - t0))
    llm.close()
    return out


async def run_engine(
    engine: LlamaCppEngine, n: int, max_tokens: int
) -> tuple[int, float, list[float]]:
    """All n requests at once: (total completion tokens, wall seconds, TTFTs)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    async def one(i: int, messages: list[dict[str, str]]) -> Finished:
        last = None
        async for event in engine.generate(f"bench-{n}-{i}", messages, params):
            last = event
        assert isinstance(last, Finished)
        return last

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i, m) for i, m in enumerate(requests(n))))
    wall = time.perf_counter() - t0
    ttfts = [(f.first_token_at or f.finished_at) - f.queued_at for f in results]
    return sum(f.completion_tokens for f in results), wall, ttfts


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--levels", default="1,4,8,16")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--budget", type=int, default=EngineSettings.step_token_budget)
    parser.add_argument("--no-flash-attn", action="store_true")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    model_path = str(resolve_model_path(os.environ.get("MODEL_PATH")))

    settings = EngineSettings(
        threads=args.threads,
        max_seqs=max(16, max(levels)),
        step_token_budget=args.budget,
    )
    engine = LlamaCppEngine(settings, flash_attn=not args.no_flash_attn)
    await engine.start()
    await run_engine(engine, 2, 8)  # warm-up
    measured = {}
    for n in levels:
        measured[n] = await run_engine(engine, n, args.max_tokens)
    await engine.shutdown()

    print(f"model {model_path}\nthreads {args.threads}, max_tokens {args.max_tokens}, greedy")
    print("baseline: Llama.create_chat_completion, requests one after another ...", flush=True)
    base = run_baseline(model_path, args.threads, args.max_tokens, max(levels))

    print()
    print(
        f"{'concurrent':>10} {'engine tok/s':>13} {'baseline tok/s':>15} {'ratio':>6} "
        f"{'engine TTFT p50':>16} {'tokens':>7}"
    )
    for n in levels:
        tokens, wall, ttfts = measured[n]
        b_tokens = sum(t for t, _ in base[:n])
        b_time = sum(s for _, s in base[:n])
        rate, b_rate = tokens / wall, b_tokens / b_time
        print(
            f"{n:>10} {rate:>13.1f} {b_rate:>15.1f} {rate / b_rate:>6.2f} "
            f"{statistics.median(ttfts) * 1000:>13.0f} ms {tokens:>7}"
        )
    print(
        f"\nbaseline per request: {statistics.mean(s for _, s in base):.2f} s mean, "
        f"{sum(t for t, _ in base) / sum(s for _, s in base):.1f} tok/s"
    )


if __name__ == "__main__":
    asyncio.run(main())
