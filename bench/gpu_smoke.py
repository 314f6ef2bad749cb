"""GPU smoke test of the TensorRT-LLM engine: stream one reply, abort another, report latencies.

Run on a machine with an NVIDIA GPU and TensorRT-LLM installed (`pip install -e '.[gpu]'
--extra-index-url https://pypi.nvidia.com`):

    python bench/gpu_smoke.py --model HuggingFaceTB/SmolLM2-135M-Instruct

It goes through `TrtLlmEngine`, i.e. exactly the adapter the server uses, and checks what the unit
tests can only check against a fake:

1. a reply streams: time to first token (TTFT) and the gaps between streamed deltas are printed;
2. a second reply is aborted after a few deltas: it must end with `cancelled`, confirmed by
   TensorRT-LLM itself (its finish_reason "cancelled", not our grace timer), well before max_tokens.

Exit status: 0 when both checks pass, 1 when one fails, 2 when TensorRT-LLM is not available.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.engine.base import Finished, FinishReason, SamplingParams, TextDelta
from app.engine.trtllm import (
    ABORT_GRACE_S,
    DEFAULT_MODEL,
    INSTALL_HINT,
    TrtLlmEngine,
    TrtLlmUnavailableError,
    tensorrt_llm_installed,
)
from app.settings import EngineSettings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="HF model name or local directory")
    parser.add_argument("--max-tokens", type=int, default=128, help="reply length for the stream")
    parser.add_argument("--abort-after", type=int, default=8, help="deltas before the abort")
    parser.add_argument("--context", type=int, default=2048, help="max_seq_len")
    parser.add_argument(
        "--worker-process",
        action="store_true",
        help="run TensorRT-LLM's executor in a worker process (default: in-process)",
    )
    return parser.parse_args(argv)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def stream_reply(engine: TrtLlmEngine, max_tokens: int) -> bool:
    messages = [{"role": "user", "content": "Write a short paragraph about the sea."}]
    sent = time.perf_counter()
    arrivals: list[float] = []
    text: list[str] = []
    finished: Finished | None = None
    async for event in engine.generate(
        "smoke-stream", messages, SamplingParams(max_tokens=max_tokens)
    ):
        if isinstance(event, TextDelta):
            arrivals.append(time.perf_counter())
            text.append(event.text)
        else:
            finished = event
    assert finished is not None  # every stream ends with Finished
    print(f"reply ({finished.reason}, {finished.completion_tokens} tokens): {''.join(text)!r}")
    if not arrivals:
        print("FAIL: the reply streamed no text")
        return False
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    print(f"TTFT (client): {ms(arrivals[0] - sent)}")
    if finished.first_token_at is not None:
        print(f"TTFT (engine): {ms(finished.first_token_at - finished.queued_at)}")
    if gaps:
        q = statistics.quantiles(gaps, n=10) if len(gaps) >= 2 else gaps * 9
        print(
            f"inter-delta gaps over {len(gaps)}: mean {ms(statistics.fmean(gaps))}, "
            f"p50 {ms(statistics.median(gaps))}, p90 {ms(q[8])}, max {ms(max(gaps))}"
        )
        decode_s = arrivals[-1] - arrivals[0]
        if decode_s > 0:
            print(f"decode rate: {(finished.completion_tokens - 1) / decode_s:.1f} tokens/s")
    ok = finished.reason in (FinishReason.STOP, FinishReason.LENGTH)
    if not ok:
        print(f"FAIL: the reply ended with {finished.reason}: {finished.error}")
    return ok


async def abort_reply(engine: TrtLlmEngine, abort_after: int) -> bool:
    messages = [{"role": "user", "content": "Count from 1 to 1000, separated by spaces."}]
    max_tokens = 2000
    cancelled_before = engine.stats().extra.get("trt_finish_cancelled", 0.0)
    stream = engine.generate("smoke-abort", messages, SamplingParams(max_tokens=max_tokens))
    deltas = 0
    aborted_at: float | None = None
    finished: Finished | None = None
    async for event in stream:
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == abort_after:
                aborted_at = time.perf_counter()
                engine.abort("smoke-abort")
        else:
            finished = event
    assert finished is not None
    if aborted_at is None:
        print(f"FAIL: the reply ended ({finished.reason}) before {abort_after} deltas to abort at")
        return False
    abort_latency = time.perf_counter() - aborted_at
    confirmed = engine.stats().extra.get("trt_finish_cancelled", 0.0) > cancelled_before
    print(
        f"abort: ended with {finished.reason} after {finished.completion_tokens} tokens, "
        f"{ms(abort_latency)} after abort(); TensorRT-LLM reported 'cancelled': {confirmed}"
    )
    ok = (
        finished.reason is FinishReason.CANCELLED
        and finished.completion_tokens < max_tokens
        and confirmed
        and abort_latency < ABORT_GRACE_S
    )
    if not ok:
        print("FAIL: the abort did not end the request with a confirmed `cancelled`")
    return ok


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not tensorrt_llm_installed():
        print(f"gpu_smoke: {INSTALL_HINT}", file=sys.stderr)
        return 2
    settings = EngineSettings(
        kind="trtllm",
        model_path=args.model,
        context_size=args.context,
        trtllm_in_process=not args.worker_process,
    )
    engine = TrtLlmEngine(settings)
    mode = "worker process" if args.worker_process else "in-process"
    print(f"loading {args.model} with TensorRT-LLM ({mode}) ...")
    started = time.perf_counter()
    try:
        await engine.start()
    except TrtLlmUnavailableError as exc:
        print(f"gpu_smoke: {exc}", file=sys.stderr)
        return 2
    print(f"loaded in {time.perf_counter() - started:.1f} s")
    try:
        streamed = await stream_reply(engine, args.max_tokens)
        aborted = await abort_reply(engine, args.abort_after)
        stats = engine.stats()
        print(
            f"stats: running {stats.running}, kv {stats.kv_used}/{stats.kv_total}, "
            f"tokens {stats.tokens_generated}, extra {dict(stats.extra)}"
        )
    finally:
        await engine.shutdown()
    ok = streamed and aborted
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
