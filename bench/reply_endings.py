"""Do replies end on their own? The share of sampled replies that run to the length limit.

    .venv/bin/python bench/reply_endings.py [--seeds 1] [--max-tokens 512] [--configs old,new]

Twenty short everyday prompts, each sampled with fixed seeds by the llama.cpp engine (SmolLM2),
under each sampling configuration: the old defaults (temperature 0.7, top-p 1, nothing else), the
new ones (app/domain/chat/replies/limits.py MODEL_DEFAULTS, as the page gets them), and a few single
changes in between, to show what each part does. Prints, per configuration, the share of replies
that hit `max_tokens` (finish reason `length`), and the median and mean reply length in tokens.
A looping reply is what hits the limit here: none of these prompts needs 512 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.chat.replies.limits import ReplyLimits
from app.domain.chat.schemas import ReplyOptions
from app.engine.base import Finished, FinishReason, SamplingParams
from app.engine.llamacpp.engine import LlamaCppEngine
from app.settings import EngineSettings

PROMPTS = [
    "Hi",
    "Hello!",
    "How are you today?",
    "Thanks!",
    "What should I cook for dinner tonight?",
    "Give me a tip for sleeping better.",
    "What's a good name for a cat?",
    "Tell me a joke.",
    "How do I boil an egg?",
    "What is the capital of Italy?",
    "Can you recommend a book?",
    "What's the weather like on Mars?",
    "How do I say thank you in French?",
    "Write a short poem about rain.",
    "What time is it in Tokyo when it is noon in London?",
    "Why do leaves change colour in autumn?",
    "Suggest a weekend activity for a family.",
    "What is 12 times 7?",
    "How can I be more productive?",
    "Good morning!",
]

# name -> the options a page request would carry (the rest from MODEL_DEFAULTS, except "old")
CONFIGS: dict[str, ReplyOptions | None] = {
    "old": None,  # the defaults before issue 11: temperature 0.7, top-p 1, no min-p, no penalty
    "card": ReplyOptions(min_p=0.0, repeat_penalty=1.0),  # the model card's temperature/top-p
    "card+min_p": ReplyOptions(repeat_penalty=1.0),
    "card+repeat": ReplyOptions(min_p=0.0),
    "new": ReplyOptions(),  # MODEL_DEFAULTS
    "old+min_p+repeat": ReplyOptions(temperature=0.7, top_p=1.0),
}


def params_for(name: str, seed: int, max_tokens: int, context: int) -> SamplingParams:
    options = CONFIGS[name]
    if options is None:
        return SamplingParams(max_tokens=max_tokens, temperature=0.7, top_p=1.0, seed=seed)
    limits = ReplyLimits(default_max_tokens=max_tokens, max_message_chars=16000)
    return limits.sampling(
        ReplyOptions(**{**_fields(options), "seed": seed, "max_tokens": max_tokens}), context
    )


def _fields(options: ReplyOptions) -> dict[str, object]:
    return {f: getattr(options, f) for f in options.__struct_fields__}


async def one(engine: LlamaCppEngine, rid: str, prompt: str, params: SamplingParams) -> Finished:
    stream = engine.generate(rid, [{"role": "user", "content": prompt}], params)
    async for event in stream:
        if isinstance(event, Finished):
            return event
    raise AssertionError("stream ended without Finished")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1, help="seeds per prompt (0, 1, ...)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    names = args.configs.split(",")
    settings = EngineSettings(context_size=1024, max_seqs=16, kv_cells=16384, threads=2)
    engine = LlamaCppEngine(settings)
    await engine.start()
    rows = []
    try:
        for name in names:
            jobs = [
                one(
                    engine,
                    f"{name}-{i}-{seed}",
                    prompt,
                    params_for(name, seed, args.max_tokens, settings.context_size),
                )
                for i, prompt in enumerate(PROMPTS)
                for seed in range(args.seeds)
            ]
            ends = await asyncio.gather(*jobs)
            lengths = [e.completion_tokens for e in ends]
            hit = sum(e.reason is FinishReason.LENGTH for e in ends)
            rows.append(
                (name, hit, len(ends), statistics.median(lengths), statistics.mean(lengths))
            )
            print(f"  {name}: {hit}/{len(ends)} hit the limit", file=sys.stderr, flush=True)
    finally:
        await engine.shutdown()
    print(f"\n{len(PROMPTS)} prompts x {args.seeds} seed(s), max_tokens {args.max_tokens}\n")
    print("| configuration | hit the limit | median tokens | mean tokens |")
    print("|---|---|---|---|")
    for name, hit, total, median, mean in rows:
        print(f"| {name} | {hit}/{total} ({hit / total:.0%}) | {median:.0f} | {mean:.0f} |")


if __name__ == "__main__":
    asyncio.run(main())
