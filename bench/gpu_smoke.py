"""GPU smoke test of the TensorRT-LLM engine: everything the fake-backed tests cannot prove.

Run on a machine with an NVIDIA GPU, TensorRT-LLM >= 1.0 (`pip install -e '.[gpu]'
--extra-index-url https://pypi.nvidia.com`) and a Hugging Face model (a name or a local folder):

    python bench/gpu_smoke.py --model /models/SmolLM2-135M-Instruct

It drives `TrtLlmEngine`, the adapter the server uses, in one run of a few minutes, and prints a
table with one row per check (see bench/README.md for what each row proves):

  streams      8 concurrent streams: TTFT and inter-token gap p50/p99, aggregate tokens/s
  stop_running Stop mid-reply: `cancelled`, confirmed by TensorRT-LLM, `running` back to 0, KV
               blocks back to the idle baseline
  stop_queued  Stop of a request waiting for a slot (max_batch_size + 2 requests): `cancelled` with
               no tokens at once, `running` back to 0, KV blocks back to the baseline
  sampling     temperature 0.8: two unseeded replies differ (the TRTLLM sampler seeds an unseeded
               request with 0, NVIDIA/TensorRT-LLM#1000), two with one seed are identical (where
               the release's sampler honours `seed`: the engine logs the fields it ignores)
  penalty      a repetition penalty takes effect on the installed release: the greedy reply to a
               counting prompt changes with repeat_penalty 1.5
  cache_owner  prefix cache isolation: TTFT of a long prompt cold, again from the same owner (a
               cache hit where the release salts per owner) and from a second owner, who must
               be no faster than cold (within 20 %)
  dead_worker  kill -9 of TensorRT-LLM's worker process (worker-process mode): every running
               reply ends `error` within seconds, the engine reports itself unavailable, and a
               new LLM serves again
  stop_string  a stop string taken from a greedy reply ends the same reply right before it
  shutdown     shutdown with replies in flight: every one ends `cancelled`, shutdown returns
  modes        the 8-stream gaps and the event loop's lag, in-process against worker process (the
               other mode runs in a child process: TensorRT-LLM reads the switch once per process)

Exit status: 0 when every check passes, 1 when one fails, 2 when TensorRT-LLM is not available.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.engine.base import Finished, FinishReason, SamplingParams, TextDelta
from app.engine.trtllm.engine import ABORT_GRACE_S, TrtLlmEngine
from app.engine.trtllm.setup import (
    DEFAULT_MODEL,
    INSTALL_HINT,
    TrtLlmUnavailableError,
    tensorrt_llm_installed,
)
from app.engine.trtllm.stats import STATS_POLL_S
from app.settings import EngineSettings

STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by spaces."}]


@dataclass
class Row:
    name: str
    ok: bool
    detail: str


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="HF model name or local directory")
    parser.add_argument("--context", type=int, default=2048, help="max_seq_len")
    parser.add_argument("--max-batch", type=int, default=8, help="max_batch_size")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams")
    parser.add_argument("--max-tokens", type=int, default=128, help="reply length per stream")
    parser.add_argument("--abort-after", type=int, default=8, help="deltas before Stop")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the executor in this process (TLLM_WORKER_USE_SINGLE_PROCESS=1); "
        "default: the worker process, as the server does",
    )
    parser.add_argument("--skip-modes", action="store_true", help="no in-process/worker row")
    parser.add_argument(
        "--latency-only", action="store_true", help=argparse.SUPPRESS
    )  # the child of the `modes` row: print one JSON line of latencies
    args = parser.parse_args(argv)
    if args.streams > args.max_batch:
        parser.error("--streams must not exceed --max-batch (they must all run at once)")
    return args


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def stream_one(
    engine: TrtLlmEngine,
    rid: str,
    messages: list[dict[str, str]],
    params: SamplingParams,
    owner: str | None = None,
) -> tuple[str, list[float], Finished, float, list[int]]:
    """One reply: its text, the arrival time of each delta, its Finished, when it was sent, and
    its token ids."""
    sent = time.perf_counter()
    arrivals: list[float] = []
    text: list[str] = []
    ids: list[int] = []
    finished: Finished | None = None
    async for event in engine.generate(rid, messages, params, owner=owner):
        if isinstance(event, TextDelta):
            arrivals.append(time.perf_counter())
            text.append(event.text)
            ids.extend(event.token_ids)
        else:
            finished = event
    assert finished is not None  # every stream ends with Finished
    return "".join(text), arrivals, finished, sent, ids


async def loop_lag(stop: asyncio.Event, lags: list[float], period: float = 0.01) -> None:
    """How late the event loop wakes a 10 ms sleeper: the web server's share of the loop."""
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - start - period)


async def latency(engine: TrtLlmEngine, streams: int, max_tokens: int) -> dict[str, float]:
    lags: list[float] = []
    stop = asyncio.Event()
    lagger = asyncio.create_task(loop_lag(stop, lags))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    started = time.perf_counter()
    results = await asyncio.gather(
        *(stream_one(engine, f"lat-{i}", STORY, params) for i in range(streams))
    )
    wall = time.perf_counter() - started
    stop.set()
    await lagger
    ttft = [arrivals[0] - sent for _, arrivals, _, sent, _ in results if arrivals]
    gaps = [b - a for _, arrivals, _, _, _ in results for a, b in itertools.pairwise(arrivals)]
    tokens = sum(fin.completion_tokens for _, _, fin, _, _ in results)
    ends = {fin.reason for _, _, fin, _, _ in results}
    return {
        "ok": float(ends <= {FinishReason.STOP, FinishReason.LENGTH} and len(ttft) == streams),
        "ttft_p50": pct(ttft, 0.5) if ttft else -1,
        "ttft_p99": pct(ttft, 0.99) if ttft else -1,
        "gap_p50": pct(gaps, 0.5) if gaps else -1,
        "gap_p99": pct(gaps, 0.99) if gaps else -1,
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "lag_p50": pct(lags, 0.5) if lags else -1,
        "lag_p99": pct(lags, 0.99) if lags else -1,
    }


async def settled(engine: TrtLlmEngine, wait_s: float = 10.0) -> tuple[int, float]:
    """Wait for `running` 0 and a stats poll after the last iteration: (running, KV blocks used)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.running == 0 and stats.extra.get("trt_active_requests", 0.0) == 0.0:
            await asyncio.sleep(STATS_POLL_S * 2)  # one more poll, to be sure it is the last
            break
        await asyncio.sleep(0.05)
    stats = engine.stats()
    return stats.running, stats.extra.get("trt_kv_used_blocks", -1.0)


async def check_streams(engine: TrtLlmEngine, args: argparse.Namespace) -> Row:
    r = await latency(engine, args.streams, args.max_tokens)
    return Row(
        "streams",
        bool(r["ok"]),
        f"{args.streams} streams: TTFT p50 {ms(r['ttft_p50'])} p99 {ms(r['ttft_p99'])}; gap p50 "
        f"{ms(r['gap_p50'])} p99 {ms(r['gap_p99'])}; {r['tok_s']:.0f} tok/s aggregate",
    )


async def check_stop_running(engine: TrtLlmEngine, args: argparse.Namespace, kv0: float) -> Row:
    confirmed_before = engine.stats().extra.get("trt_finish_cancelled", 0.0)
    stream = engine.generate("stop-running", COUNT, SamplingParams(max_tokens=2000, temperature=0))
    deltas, aborted_at, finished = 0, 0.0, None
    async for event in stream:
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == args.abort_after:
                aborted_at = time.perf_counter()
                engine.abort("stop-running")
        else:
            finished = event
    assert finished is not None
    latency_s = time.perf_counter() - aborted_at if aborted_at else -1.0
    running, kv = await settled(engine)
    confirmed = engine.stats().extra.get("trt_finish_cancelled", 0.0) > confirmed_before
    ok = (
        aborted_at > 0
        and finished.reason is FinishReason.CANCELLED
        and finished.completion_tokens < 2000
        and confirmed
        and latency_s < ABORT_GRACE_S
        and running == 0
        and kv == kv0
    )
    return Row(
        "stop_running",
        ok,
        f"{finished.reason} after {finished.completion_tokens} tokens, {ms(latency_s)} after "
        f"Stop, confirmed by TensorRT-LLM: {confirmed}; running {running}; KV blocks {kv:.0f} "
        f"(idle baseline {kv0:.0f})",
    )


async def check_stop_queued(engine: TrtLlmEngine, args: argparse.Namespace, kv0: float) -> Row:
    params = SamplingParams(max_tokens=2000, temperature=0.0)
    total = args.max_batch + 2
    streams = [engine.generate(f"q-{i}", COUNT, params) for i in range(total)]
    for stream in streams[: args.max_batch]:  # the first max_batch run ...
        await anext(stream)
    for _ in range(round(3 * STATS_POLL_S / 0.05)):  # the next stats poll shows the queue
        if engine.stats().waiting:
            break
        await asyncio.sleep(0.05)
    waited = engine.stats().waiting
    victim = f"q-{total - 1}"  # ... the last waits for a slot
    stopped_at = time.perf_counter()
    engine.abort(victim)
    victim_events = [event async for event in streams[-1]]
    victim_latency = time.perf_counter() - stopped_at
    fin = victim_events[-1]
    assert isinstance(fin, Finished)
    for i in range(total - 1):
        engine.abort(f"q-{i}")
    others = await asyncio.gather(*(collect_finish(s) for s in streams[:-1]))
    running, kv = await settled(engine)
    ok = (
        fin.reason is FinishReason.CANCELLED
        and fin.completion_tokens == 0
        and len(victim_events) == 1
        and victim_latency < 1.0
        and all(f.reason is FinishReason.CANCELLED for f in others)
        and running == 0
        and kv == kv0
    )
    return Row(
        "stop_queued",
        ok,
        f"{total} requests, max_batch_size {args.max_batch}, {waited} waiting (iteration stats);"
        f" the queued one ended {fin.reason} with {fin.completion_tokens} tokens "
        f"{ms(victim_latency)} after Stop; running {running}; KV blocks {kv:.0f} "
        f"(baseline {kv0:.0f})",
    )


async def collect_finish(stream: object) -> Finished:
    finished = None
    async for event in stream:  # type: ignore[attr-defined]
        if isinstance(event, Finished):
            finished = event
    assert finished is not None
    return finished


async def check_sampling(engine: TrtLlmEngine) -> Row:
    async def reply(rid: str, params: SamplingParams) -> list[int]:
        return (await stream_one(engine, rid, STORY, params))[4]  # the sampled token ids

    warm = SamplingParams(max_tokens=48, temperature=0.8)
    a, b = await reply("s-a", warm), await reply("s-b", warm)
    seeded = replace(warm, seed=1234)
    c, d = await reply("s-c", seeded), await reply("s-d", seeded)
    ok = a != b and c == d
    return Row(
        "sampling",
        ok,
        f"sampler {engine.sampler}; unseeded replies differ: {a != b}; seed 1234 twice "
        f"identical: {c == d}",
    )


async def check_penalty(engine: TrtLlmEngine) -> Row:
    greedy = SamplingParams(max_tokens=64, temperature=0.0)
    plain, _, _, _, _ = await stream_one(engine, "pen-a", COUNT, greedy)
    penalised, _, _, _, _ = await stream_one(
        engine, "pen-b", COUNT, replace(greedy, repeat_penalty=1.5)
    )
    return Row(
        "penalty",
        plain != penalised,
        f"sampler {engine.sampler}: greedy reply changed by repeat_penalty 1.5: "
        f"{plain != penalised} ({plain[:30]!r} -> {penalised[:30]!r})",
    )


async def check_cache_owner(engine: TrtLlmEngine) -> Row:
    one = SamplingParams(max_tokens=1, temperature=0.0)
    long = [{"role": "user", "content": "Summarise this. " + " ".join(map(str, range(1500)))}]

    async def ttft(rid: str, owner: str) -> float:
        _, arrivals, _, sent, _ = await stream_one(engine, rid, long, one, owner=owner)
        return arrivals[0] - sent if arrivals else float("inf")

    cold = await ttft("co-a", "owner-a")
    again = await ttft("co-b", "owner-a")
    other = await ttft("co-c", "owner-b")
    return Row(
        "cache_owner",
        other >= 0.8 * cold,
        f"TTFT cold {ms(cold)}, same owner again {ms(again)}, second owner {ms(other)}",
    )


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (TensorRT-LLM's MPI worker and its helpers), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


async def check_dead_worker(engine: TrtLlmEngine, args: argparse.Namespace) -> Row:
    if engine.in_process:
        return Row("dead_worker", True, "n/a: the executor runs in this process")
    params = SamplingParams(max_tokens=2000, temperature=0.0)
    streams = [engine.generate(f"dw-{i}", COUNT, params) for i in range(args.max_batch)]
    await anext(streams[0])
    workers = descendants(os.getpid())
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = time.perf_counter()
    finishes = await asyncio.wait_for(asyncio.gather(*(collect_finish(s) for s in streams)), 60)
    ended = time.perf_counter() - killed
    why = engine.stats().unavailable
    for _ in range(600):  # a new LLM loads the model again: minutes at most
        if engine.stats().unavailable is None:
            break
        await asyncio.sleep(1)
    back = time.perf_counter() - killed
    ok = all(f.reason is FinishReason.ERROR for f in finishes) and ended < 5.0
    ok = ok and why is not None and engine.stats().unavailable is None
    return Row(
        "dead_worker",
        ok,
        f"killed {len(workers)} processes: {len(finishes)} replies ended "
        f"{sorted({f.reason.value for f in finishes})} in {ended:.1f} s; unavailable: {why!r}; "
        f"serving again after {back:.0f} s",
    )


async def check_stop_string(engine: TrtLlmEngine) -> Row:
    greedy = SamplingParams(max_tokens=64, temperature=0.0)
    text, _, _, _, _ = await stream_one(engine, "ss-a", STORY, greedy)
    middle = len(text) // 2
    stop = text[middle : middle + 4]
    if not stop.strip():
        return Row("stop_string", False, f"no usable stop string in {text!r}")
    cut, _, fin, _, _ = await stream_one(engine, "ss-b", STORY, replace(greedy, stop=(stop,)))
    await settled(engine)  # TensorRT-LLM has confirmed the abort that ended it
    counts = engine.stats().extra
    ok = fin.reason is FinishReason.STOP and cut == text[: text.index(stop)]
    return Row(
        "stop_string",
        ok,
        f"stop {stop!r}: ended {fin.reason} after {len(cut)} of {len(text)} chars; counted as "
        f"stop_string {counts.get('trt_finish_stop_string', 0):.0f} times",
    )


async def check_shutdown(engine: TrtLlmEngine, args: argparse.Namespace) -> Row:
    params = SamplingParams(max_tokens=2000, temperature=0.0)
    streams = [engine.generate(f"sd-{i}", COUNT, params) for i in range(args.max_batch + 2)]
    await anext(streams[0])
    started = time.perf_counter()
    await engine.shutdown()
    took = time.perf_counter() - started
    finishes = await asyncio.gather(*(collect_finish(s) for s in streams))
    ok = all(f.reason is FinishReason.CANCELLED for f in finishes)
    return Row(
        "shutdown",
        ok,
        f"{len(streams)} in flight: all cancelled: {ok}; shutdown took {took:.1f} s",
    )


def other_mode_latency(args: argparse.Namespace) -> dict[str, float] | None:
    """The same 8-stream measurement in a child process, in the other worker mode."""
    command = [
        sys.executable,
        __file__,
        "--latency-only",
        "--model",
        args.model,
        "--context",
        str(args.context),
        "--streams",
        str(args.streams),
        "--max-tokens",
        str(args.max_tokens),
        "--max-batch",
        str(args.max_batch),
    ]
    if not args.in_process:
        command.append("--in-process")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    print(done.stdout[-2000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    return None


def modes_row(mine: dict[str, float], other: dict[str, float] | None, in_process: bool) -> Row:
    if other is None:
        return Row("modes", False, "the other mode's run failed (its output is above)")
    names = ("in-process", "worker") if in_process else ("worker", "in-process")
    detail = "; ".join(
        f"{name}: gap p50 {ms(r['gap_p50'])} p99 {ms(r['gap_p99'])}, loop lag p99 "
        f"{ms(r['lag_p99'])}, {r['tok_s']:.0f} tok/s"
        for name, r in zip(names, (mine, other), strict=True)
    )
    return Row("modes", bool(mine["ok"] and other["ok"]), detail)


def print_table(rows: list[Row]) -> None:
    width = max(len(r.name) for r in rows)
    print(f"\n{'check':<{width}}  result  detail")
    for r in rows:
        print(f"{r.name:<{width}}  {'PASS' if r.ok else 'FAIL':<6}  {r.detail}")


async def run(args: argparse.Namespace) -> int:
    if not tensorrt_llm_installed():
        print(f"gpu_smoke: {INSTALL_HINT}", file=sys.stderr)
        return 2
    settings = EngineSettings(
        kind="trtllm",
        model_path=args.model,
        context_size=args.context,
        max_seqs=args.max_batch,
        trtllm_in_process=args.in_process,
    )
    engine = TrtLlmEngine(settings)
    started = time.perf_counter()
    try:
        await engine.start()
    except TrtLlmUnavailableError as exc:
        print(f"gpu_smoke: {exc}", file=sys.stderr)
        return 2
    if args.latency_only:
        try:
            await latency(engine, args.streams, args.max_tokens)  # warm-up
            print(json.dumps(await latency(engine, args.streams, args.max_tokens)))
        finally:
            await engine.shutdown()
        return 0
    mode = "in-process" if engine.in_process else "worker process"
    print(
        f"loaded {args.model} ({mode}, sampler {engine.sampler}) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    rows: list[Row] = []
    mine: dict[str, float] = {}
    try:
        await latency(engine, 2, 16)  # warm-up: CUDA graphs, allocator
        _, kv0 = await settled(engine)
        checks: list[tuple[str, Callable[[], Awaitable[Row]]]] = [
            ("streams", lambda: check_streams(engine, args)),
            ("stop_running", lambda: check_stop_running(engine, args, kv0)),
            ("stop_queued", lambda: check_stop_queued(engine, args, kv0)),
            ("sampling", lambda: check_sampling(engine)),
            ("stop_string", lambda: check_stop_string(engine)),
            ("penalty", lambda: check_penalty(engine)),
            ("cache_owner", lambda: check_cache_owner(engine)),
            ("dead_worker", lambda: check_dead_worker(engine, args)),  # last: it restarts
        ]
        for name, check in checks:
            try:
                rows.append(await check())
            except Exception as exc:  # a broken check is a failed row, not the end of the run
                rows.append(Row(name, False, f"raised {exc!r}"))
        if not args.skip_modes:
            mine = await latency(engine, args.streams, args.max_tokens)
    finally:
        rows.append(await check_shutdown(engine, args))
    if not args.skip_modes:
        rows.append(modes_row(mine, other_mode_latency(args), bool(engine.in_process)))
    print_table(rows)
    ok = all(r.ok for r in rows)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
