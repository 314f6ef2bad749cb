"""Does a long prompt freeze the streams already running? Chunked prefill, measured.

    python bench/chunked_prefill.py [--stretches 2,off] [--prompt-tokens 1500]

Eight greedy streams decode; once they are in their stride, a ~1,500-token prompt arrives. We record
when each of the eight streams' events reach asyncio and report, for the prefill window (from the
long prompt's arrival to its first token):

- the median, p99 and maximum inter-token gap of the eight streams inside the window,
- their median and maximum gap before the long prompt arrived (steady decoding; with a long
  `--warm-tokens` phase its maximum is the machine's own noise, what no schedule can go under),
- the long prompt's time to first token.

With the engine's time-based prompt budget (app/engine/llamacpp/step_clock.py: a step carrying a prompt
chunk may last `step_stretch` times a decode-only step), the prompt enters a slice per step and
every step still advances the eight streams: the gaps grow by the slice's cost but never freeze.
The control run (`off`: no bound, steps of up to 4,096 tokens) prefills it in one step: every
stream stalls for the whole prefill (seconds on CPU). The default stretch
(`EngineSettings.step_stretch`, with its floor) comes first.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.base import Finished, SamplingParams, TextDelta
from app.engine.llamacpp.engine import LlamaCppEngine
from app.settings import EngineSettings

STREAM_TOPICS = [
    "a lighthouse keeper",
    "a robot learning to paint",
    "a city under the sea",
    "a dragon who fears fire",
    "a journey across a desert",
    "a cat who becomes mayor",
    "a library that never closes",
    "a train that never stops",
]

FILLER = (
    "The committee met on a grey Tuesday to review the harbour accounts, the repairs to the north "
    "pier, the price of rope and tar, and the long list of complaints from the fishermen about the "
    "new mooring fees. "
)


def long_prompt(engine: LlamaCppEngine, tokens: int) -> list[dict[str, str]]:
    """A user message whose rendered prompt is about `tokens` tokens long."""
    native = engine._native
    assert native is not None
    per = len(native.tokenize(FILLER))
    text = FILLER * max(1, tokens // per)
    return [{"role": "user", "content": text + "\nSummarise the meeting in one sentence."}]


async def trial(
    stretch: float, prompt_tokens: int, threads: int, warm_tokens: int, floor_ms: float
) -> dict[str, float]:
    settings = EngineSettings(
        threads=threads,
        step_stretch=stretch,
        step_floor_ms=floor_ms,
        max_seqs=16,
        max_step_tokens=4096,
    )
    engine = LlamaCppEngine(settings)
    await engine.start()
    stamps: list[list[float]] = [[] for _ in STREAM_TOPICS]
    params = SamplingParams(max_tokens=1000, temperature=0.0)

    async def stream(i: int) -> None:
        messages = [
            {"role": "user", "content": f"Write a very long story about {STREAM_TOPICS[i]}."}
        ]
        async for event in engine.generate(f"s{i}", messages, params):
            if isinstance(event, TextDelta):
                stamps[i].append(time.perf_counter())
                if min(len(s) for s in stamps) >= warm_tokens:
                    warm.set()

    warm = asyncio.Event()
    tasks = [asyncio.create_task(stream(i)) for i in range(len(STREAM_TOPICS))]
    await warm.wait()

    messages = long_prompt(engine, prompt_tokens)
    t_submit = time.perf_counter()
    first_at = None
    fin = None
    async for event in engine.generate(
        "long", messages, SamplingParams(max_tokens=4, temperature=0)
    ):
        if isinstance(event, TextDelta) and first_at is None:
            first_at = time.perf_counter()
        if isinstance(event, Finished):
            fin = event
            first_at = first_at or time.perf_counter()
    assert fin is not None and first_at is not None
    await asyncio.sleep(0.3)  # a few steady steps after the window
    for i in range(len(STREAM_TOPICS)):
        engine.abort(f"s{i}")
    await asyncio.gather(*tasks)
    await engine.shutdown()

    before, inside = [], []
    for times in stamps:
        for a, b in itertools.pairwise(times):
            if b < t_submit:
                before.append(b - a)
            elif b <= first_at + 1e-3:
                inside.append(b - a)
    return {
        "stretch": stretch,
        "prompt_tokens": fin.prompt_tokens,
        "steady_median": statistics.median(before),
        "steady_max": max(before),
        "median": statistics.median(inside),
        "p99": p99(inside),
        "max": max(inside),
        "ttft": first_at - t_submit,
    }


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def row(label: str, r: dict[str, float]) -> str:
    ok = "yes" if r["max"] <= 3 * r["steady_median"] else "no"
    return (
        f"{label:>14} {r['prompt_tokens']:>7.0f} {r['steady_median'] * 1e3:>8.1f} ms "
        f"{r['steady_max'] * 1e3:>8.1f} ms {r['median'] * 1e3:>8.1f} ms {r['p99'] * 1e3:>8.1f} ms "
        f"{r['max'] * 1e3:>8.1f} ms {r['p99'] / r['steady_median']:>11.1f} "
        f"{r['max'] / r['steady_median']:>11.1f} {ok:>6} {r['ttft']:>8.2f} s"
    )


OFF = 1e9  # a stretch no step reaches: the whole prompt in one step


async def main() -> None:
    default = EngineSettings.step_stretch
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stretches", default=f"{default},off", help="'off': no bound")
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=EngineSettings.threads)
    parser.add_argument("--warm-tokens", type=int, default=10)
    parser.add_argument("--reps", type=int, default=2, help="trials per stretch (medians shown)")
    parser.add_argument("--floor-ms", type=float, default=EngineSettings.step_floor_ms)
    args = parser.parse_args()
    stretches = [OFF if s == "off" else float(s) for s in args.stretches.split(",")]

    print(
        f"8 streams decoding, then a ~{args.prompt_tokens}-token prompt; {args.threads} threads; "
        f"default stretch {default} (floor {args.floor_ms:.0f} ms); "
        f"<=3x: window max within 3x the steady median gap. Steady: the gaps before the prompt "
        f"(--warm-tokens of each stream); its max is the machine's own noise"
    )
    header = (
        f"{'stretch':>14} {'prompt':>7} {'steady p50':>11} {'steady max':>11} {'window p50':>11} "
        f"{'window p99':>11} {'window max':>11} {'p99/steady':>11} {'max/steady':>11} {'<=3x':>6} "
        f"{'long TTFT':>10}"
    )
    print(header)

    def name(stretch: float) -> str:
        return "off (control)" if stretch == OFF else f"{stretch:g}"

    results: dict[float, list[dict[str, float]]] = {s: [] for s in stretches}
    for rep in range(args.reps):
        for stretch in stretches:
            r = await trial(
                stretch, args.prompt_tokens, args.threads, args.warm_tokens, args.floor_ms
            )
            results[stretch].append(r)
            print(row(f"{name(stretch)} (run {rep + 1})", r), flush=True)
    print("\nmedians over runs:\n" + header)
    for stretch in stretches:
        runs = results[stretch]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(row(name(stretch), med))


if __name__ == "__main__":
    asyncio.run(main())
