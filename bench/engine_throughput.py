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

The baseline runs in a child process started before the engine is imported, so it gets the
environment as you set it (the engine module sets GOMP_SPINCOUNT for itself, see
`app/engine/llamacpp/native.py`), and so its OpenMP threads are not counted against this process's:
libgomp stops spinning at barriers as soon as a process holds more OpenMP threads than CPUs, which
slowed both sides by half when they shared one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.llamacpp.model_files import resolve_model_path  # (imports no llama_cpp)
from app.settings import EngineSettings

if TYPE_CHECKING:
    from app.engine.llamacpp.engine import LlamaCppEngine

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


def requests(n: int, tag: str) -> list[list[dict[str, str]]]:
    """n chat requests, different from every other call's (`tag`): no side ever sees a prompt
    twice, so prefix reuse (llama-cpp-python keeps the previous prompt's cache, the engine keeps
    recent ones) can only share the common start, the same for both sides."""
    return [
        [
            {
                "role": "user",
                "content": f"Write a long, detailed story about {TOPICS[i % 16]} (#{tag}-{i}).",
            }
        ]
        for i in range(n)
    ]


def baseline_worker(model_path: str, threads: int) -> None:
    """Child process: llama-cpp-python's high-level API, one request at a time, on command.

    Reads "n max_tokens tag" lines; answers each with [total completion tokens, total seconds] for n
    requests served one after another.
    """
    import llama_cpp
    from llama_cpp import Llama

    # no weight repacking, as the engine (app/engine/llamacpp/native.py: AMX kernels crash);
    # `Llama` has no argument for it, so its defaults are patched
    defaults = llama_cpp.llama_model_default_params

    def plain_weights() -> llama_cpp.llama_model_params:
        params = defaults()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_model_default_params = plain_weights
    llm = Llama(
        model_path=model_path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    llm.create_chat_completion(requests(1, "warm")[0], max_tokens=8, temperature=0.0)
    print("ready", flush=True)
    for line in sys.stdin:
        n, max_tokens, tag = line.split()
        tokens, seconds = 0, 0.0
        for messages in requests(int(n), tag):
            max_tokens = int(max_tokens)
            t0 = time.perf_counter()
            reply = llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0)
            seconds += time.perf_counter() - t0
            tokens += reply["usage"]["completion_tokens"]
        print(json.dumps([tokens, seconds]), flush=True)


class Baseline:
    """Handle on the baseline child process."""

    def __init__(self, model_path: str, threads: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--baseline-worker", model_path, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def run(self, n: int, max_tokens: int, tag: str) -> tuple[int, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n} {max_tokens} {tag}\n")
        self.proc.stdin.flush()
        tokens, seconds = json.loads(self.proc.stdout.readline())
        return tokens, seconds

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


async def run_engine(
    engine: LlamaCppEngine, n: int, max_tokens: int, tag: str
) -> tuple[int, float, float]:
    """All n requests at once: (total completion tokens, wall seconds, median TTFT)."""
    from app.engine.base import Finished, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    async def one(i: int, messages: list[dict[str, str]]) -> Finished:
        last = None
        async for event in engine.generate(f"bench-{time.monotonic_ns()}-{i}", messages, params):
            last = event
        assert isinstance(last, Finished), last
        return last

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i, m) for i, m in enumerate(requests(n, tag))))
    wall = time.perf_counter() - t0
    ttft = statistics.median((f.first_token_at or f.finished_at) - f.queued_at for f in results)
    return sum(f.completion_tokens for f in results), wall, ttft


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--levels", default="1,4,8,16")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=EngineSettings.threads)
    parser.add_argument("--stretch", type=float, default=EngineSettings.step_stretch)
    parser.add_argument("--no-flash-attn", action="store_true")
    parser.add_argument("--prefix-cache", type=int, default=8, help="entries; 0 turns it off")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    model_path = str(resolve_model_path(os.environ.get("MODEL_PATH")))
    spin_before = os.environ.get("GOMP_SPINCOUNT")
    baseline = Baseline(model_path, args.threads)  # before the engine module touches the env

    from app.engine.llamacpp.engine import LlamaCppEngine

    settings = EngineSettings(
        threads=args.threads, max_seqs=max(16, *levels), step_stretch=args.stretch
    )
    engine = LlamaCppEngine(
        settings, flash_attn=not args.no_flash_attn, prefix_cache=args.prefix_cache
    )
    await engine.start()
    await run_engine(engine, 2, 8, "warm")
    print(f"model {model_path}")
    print(
        f"threads {args.threads}, max_tokens {args.max_tokens}, greedy, step stretch {args.stretch:g}, "
        f"prefix cache {args.prefix_cache}, "
        f"{args.reps} repetitions (medians shown); engine GOMP_SPINCOUNT="
        f"{os.environ.get('GOMP_SPINCOUNT', '-')}, baseline's {spin_before or 'libgomp default'}",
        flush=True,
    )

    rows: dict[int, list[tuple[float, float, float, int]]] = {n: [] for n in levels}
    for rep in range(args.reps):
        for n in levels:
            engine_first = (rep + n) % 2 == 0
            tag = f"{rep}.{n}"
            if engine_first:
                tokens, wall, ttft = await run_engine(engine, n, args.max_tokens, tag)
            b_tokens, b_seconds = baseline.run(n, args.max_tokens, tag)
            if not engine_first:
                tokens, wall, ttft = await run_engine(engine, n, args.max_tokens, tag)
            rows[n].append((tokens / wall, b_tokens / b_seconds, ttft, tokens))
            print(
                f"  rep {rep + 1} n={n:<2} engine {tokens / wall:6.1f} tok/s  "
                f"baseline {b_tokens / b_seconds:6.1f} tok/s",
                flush=True,
            )
    await engine.shutdown()
    baseline.close()

    print()
    print(
        f"{'concurrent':>10} {'engine tok/s':>13} {'baseline tok/s':>15} {'ratio':>6} "
        f"{'best/best':>9} {'engine TTFT p50':>16}"
    )
    med = statistics.median
    for n in levels:
        rates = rows[n]
        ratio = med(e / b for e, b, _, _ in rates)
        best = max(r[0] for r in rates) / max(r[1] for r in rates)
        print(
            f"{n:>10} {med(r[0] for r in rates):>13.1f} {med(r[1] for r in rates):>15.1f} "
            f"{ratio:>6.2f} {best:>9.2f} {med(r[2] for r in rates) * 1000:>13.0f} ms"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--baseline-worker"]:
        baseline_worker(sys.argv[2], int(sys.argv[3]))
    else:
        asyncio.run(main())
