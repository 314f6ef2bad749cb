"""Aggregate decode throughput of the llama.cpp engine against llama-cpp-python serving one at a time.

    /work/venv/bin/python bench/engine_throughput.py [--max-tokens 64] [--levels 1,4,8,16] [--reps 3]

Both sides load the same GGUF (SmolLM2-135M-Instruct unless MODEL_PATH says otherwise) with the same
thread count, and answer the same chat requests greedily with the same max_tokens, in the same run.

- baseline: `Llama.create_chat_completion`, the high-level API with its defaults, serving the
  requests one after another (what you get without a batching engine). Its aggregate rate for N
  requests is their total completion tokens over the sum of their times.
- engine: `LlamaCppEngine`, all N requests submitted at once; total completion tokens over the wall
  time until the last one finishes.

Tokens/s counts completion tokens only, end to end (prefill included), as a client sees it. On a
shared machine the CPU is noisy, so every repetition measures engine and baseline back to back (in
alternating order) for each level, and the table shows the median over repetitions, with the
ratio computed per repetition from its own pair.
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


class Baseline:
    """llama-cpp-python's high-level API, one request at a time."""

    def __init__(self, model_path: str, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=model_path,
            n_ctx=2048,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.llm.create_chat_completion(requests(1)[0], max_tokens=8, temperature=0.0)  # warm-up

    def run(self, n: int, max_tokens: int) -> tuple[int, float]:
        """(total completion tokens, total seconds) for n requests served one after another."""
        tokens, seconds = 0, 0.0
        for messages in requests(n):
            t0 = time.perf_counter()
            reply = self.llm.create_chat_completion(
                messages, max_tokens=max_tokens, temperature=0.0
            )
            seconds += time.perf_counter() - t0
            tokens += reply["usage"]["completion_tokens"]
        return tokens, seconds


async def run_engine(engine: LlamaCppEngine, n: int, max_tokens: int) -> tuple[int, float, float]:
    """All n requests at once: (total completion tokens, wall seconds, median TTFT)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    async def one(i: int, messages: list[dict[str, str]]) -> Finished:
        last = None
        async for event in engine.generate(f"bench-{time.monotonic_ns()}-{i}", messages, params):
            last = event
        assert isinstance(last, Finished), last
        return last

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i, m) for i, m in enumerate(requests(n))))
    wall = time.perf_counter() - t0
    ttft = statistics.median((f.first_token_at or f.finished_at) - f.queued_at for f in results)
    return sum(f.completion_tokens for f in results), wall, ttft


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--levels", default="1,4,8,16")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=EngineSettings.threads)
    parser.add_argument("--budget", type=int, default=EngineSettings.step_token_budget)
    parser.add_argument("--no-flash-attn", action="store_true")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    model_path = str(resolve_model_path(os.environ.get("MODEL_PATH")))

    settings = EngineSettings(
        threads=args.threads, max_seqs=max(16, *levels), step_token_budget=args.budget
    )
    engine = LlamaCppEngine(settings, flash_attn=not args.no_flash_attn)
    await engine.start()
    await run_engine(engine, 2, 8)  # warm-up
    baseline = Baseline(model_path, args.threads)
    print(f"model {model_path}")
    print(
        f"threads {args.threads}, max_tokens {args.max_tokens}, greedy, step budget {args.budget}, "
        f"{args.reps} repetitions (medians shown)",
        flush=True,
    )

    rows: dict[int, list[tuple[float, float, float, int]]] = {n: [] for n in levels}
    for rep in range(args.reps):
        for n in levels:
            engine_first = (rep + n) % 2 == 0
            if engine_first:
                tokens, wall, ttft = await run_engine(engine, n, args.max_tokens)
            b_tokens, b_seconds = baseline.run(n, args.max_tokens)
            if not engine_first:
                tokens, wall, ttft = await run_engine(engine, n, args.max_tokens)
            rows[n].append((tokens / wall, b_tokens / b_seconds, ttft, tokens))
            print(
                f"  rep {rep + 1} n={n:<2} engine {tokens / wall:6.1f} tok/s  "
                f"baseline {b_tokens / b_seconds:6.1f} tok/s",
                flush=True,
            )
    await engine.shutdown()

    print()
    print(
        f"{'concurrent':>10} {'engine tok/s':>13} {'baseline tok/s':>15} {'ratio':>6} "
        f"{'engine TTFT p50':>16}"
    )
    for n in levels:
        rates = rows[n]
        med = statistics.median
        ratio = med(e / b for e, b, _, _ in rates)
        print(
            f"{n:>10} {med(r[0] for r in rates):>13.1f} {med(r[1] for r in rates):>15.1f} "
            f"{ratio:>6.2f} {med(r[2] for r in rates) * 1000:>13.0f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())
