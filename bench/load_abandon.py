"""Abandoned and stuck clients under load: do their replies stop, and does everything get released?

    /work/venv/bin/python bench/load_abandon.py [--streams 200] [--max-seqs 64] [--database-url URL]

Synthetic engine, `--streams` page streams opened at once (`POST /api/conversations/{id}/messages`,
one conversation each) against a server whose engine admits only `--max-seqs` sequences, so a
reply nobody reads takes a slot a waiting client needs. The clients:

- well-behaved (the rest, 75% by default): read every event to the final one;
- abandoning (`--abandon-frac`, 20%): close the connection at a random time, uniform in
  [`--close-min-s`, `--close-max-s`] after sending, like a closed tab (some while still queued);
- slow (`--slow-frac`, 5%): a raw socket with a small SO_RCVBUF (`--slow-rcvbuf`), a tiny MSS
  (`--slow-mss`, TCP_MAXSEG) and window (`--slow-window-clamp`, TCP_WINDOW_CLAMP) that reads 1 byte
  every `--slow-read-s`. They ask for long replies (`--slow-tokens`; ENGINE_CONTEXT is raised to
  fit) and are sent first, so they are admitted in the first batch. The tiny MSS and window matter
  on loopback: with the default 64 KiB MSS Linux grows the server's send buffer to ~2 MB per
  connection, so no reply is long enough to make the app's writes block; with them the kernel
  takes ~60 KB, and uvicorn's transport buffers 64 KiB more (~1,200 events of ~100 bytes in all)
  before the server's `send` blocks and the subscriber stops taking events: from then on,
  CLIENT_DEADLINE_S decides.

Two runs, each against a fresh server and database:

- CONTROL, abortion effectively disabled. The app has no switch for it, so the control sets
  PAGE_GRACE_S=3600 and CLIENT_DEADLINE_S=3600: a closed client's reply waits an hour for a resume
  that never comes, and a stuck client is never declared gone, so every reply generates until it
  ends on its own, holding its engine slot all along.
- REAL: PAGE_GRACE_S=`--grace-s` (app default 5) and CLIENT_DEADLINE_S=`--deadline-s` (5).

While they run, /admin/api/engine (running/waiting) and /admin/api/live are polled and the server's
VmRSS is read from /proc. Printed: admitted concurrency and RSS over time, TTFT and gap percentiles
of the well-behaved clients (client-side, per event), slot-seconds and tokens spent on clients that
had left, and the post-run checks:

- no engine sequence left running or waiting, and no live reply, once the well-behaved clients are
  done and grace + deadline have passed (control: once generation has ended on its own, or the
  count after `--control-wait-s`);
- every reply of the run in a final state in the database (count of status='streaming' is 0);
- the server's sockets back to their count before the run once every client has closed;
- RSS back near its start (after <= before + `--rss-slack-mb`).

Exit status 1 when a check of the REAL run fails (the control's are reported, not enforced).
Ratios compare the real run with the control measured in the same invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from serving_overhead import (
    Server,
    StreamResult,
    fmt,
    loop_name,
    new_client,
    new_conversations,
    pct,
    print_table,
    proc_rss_mb,
    ratio,
    raw_request,
    run_loop,
    signup,
    sqlite_url,
    stored_replies,
    stream_reply,
    stream_reply_raw,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# -- the slow reader ----------------------------------------------------------------------------


@dataclass
class SlowResult:
    sent_at: float
    first_byte_at: float | None = None
    local_port: int = 0
    bytes_read: int = 0
    server_closed: bool = False
    error: str | None = None


async def slow_reader(
    client: httpx.AsyncClient,
    conversation_id: str,
    body: dict[str, Any],
    *,
    rcvbuf: int,
    mss: int,
    window_clamp: int,
    read_every_s: float,
    stop: asyncio.Event,
    ports: set[int],
) -> SlowResult:
    """Send the request, then read one byte per `read_every_s` until `stop` or the server closes."""
    url = httpx.URL(str(client.base_url))
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: sets the window
    if mss:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
    if window_clamp:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, window_clamp)
    sock.setblocking(False)
    result = SlowResult(sent_at=time.time())
    try:
        await loop.sock_connect(sock, (url.host, url.port))
        result.local_port = sock.getsockname()[1]
        ports.add(result.local_port)
        await loop.sock_sendall(sock, raw_request(client, conversation_id, body))
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), read_every_s)
            if stop.is_set():
                break
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, 1), 5.0)
            except TimeoutError:
                continue
            if not data:
                result.server_closed = True
                break
            result.first_byte_at = result.first_byte_at or time.time()
            result.bytes_read += len(data)
    except OSError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()
    return result


def client_connections(server: Server) -> int:
    """TCP connections the server process holds on its HTTP port (its clients, listener excluded)."""
    return len(client_ports(server))


def client_ports(server: Server) -> list[int]:
    """The remote ports of those connections."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{server.pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{server.pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                local_port = int(cols[1].rsplit(":", 1)[1], 16)
                if (
                    local_port == server.port and cols[3] != "0A" and cols[9] in inodes
                ):  # 0A: LISTEN
                    ports.append(int(cols[2].rsplit(":", 1)[1], 16))
    return ports


# -- pollers ------------------------------------------------------------------------------------


@dataclass
class Poll:
    t: float
    running: int | None
    waiting: int | None
    tokens_generated: int | None
    live: int | None
    rss_mb: float
    sockets: int


async def poll_server(
    client: httpx.AsyncClient,
    server: Server,
    out: list[Poll],
    stop: asyncio.Event,
    period_s: float = 0.5,
) -> None:
    tick = 0
    while not stop.is_set():
        running = waiting = tokens = live = None
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            stats = (await client.get("/admin/api/engine", timeout=10)).json()
            running, waiting, tokens = (
                stats["running"],
                stats["waiting"],
                stats["tokens_generated"],
            )
        if tick % 2 == 0:  # the live list is the heavier one
            with contextlib.suppress(httpx.HTTPError, ValueError):
                live = len((await client.get("/admin/api/live", timeout=10)).json())
        out.append(
            Poll(
                time.time(),
                running,
                waiting,
                tokens,
                live,
                proc_rss_mb(server.pid),
                client_connections(server),
            )
        )
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)


async def engine_snapshot(client: httpx.AsyncClient) -> dict[str, Any]:
    stats = (await client.get("/admin/api/engine", timeout=10)).json()
    live = (await client.get("/admin/api/live", timeout=10)).json()
    return {"running": stats["running"], "waiting": stats["waiting"], "live": len(live), **stats}


async def metric_lines(client: httpx.AsyncClient, prefixes: Sequence[str]) -> list[str]:
    text = (await client.get("/metrics", timeout=10)).text
    return [ln for ln in text.splitlines() if ln.startswith(tuple(prefixes))]


async def count_streaming(database_url: str, conversation_ids: Sequence[str]) -> tuple[int, int]:
    """(replies of this run still 'streaming', all rows with status 'streaming' in the database)."""
    from sqlalchemy import func, select
    from sqlalchemy.pool import NullPool

    from app.db.engine import create_engine
    from app.domain.chat.models import Message
    from app.streaming.events import Status

    ids = [uuid.UUID(c) for c in conversation_ids]
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            mine = 0
            for i in range(0, len(ids), 500):
                mine += (
                    await conn.execute(
                        select(func.count())
                        .select_from(Message)
                        .where(
                            Message.status == Status.STREAMING,
                            Message.conversation_id.in_(ids[i : i + 500]),
                        )
                    )
                ).scalar_one()
            everywhere = (
                await conn.execute(
                    select(func.count())
                    .select_from(Message)
                    .where(Message.status == Status.STREAMING)
                )
            ).scalar_one()
    finally:
        await engine.dispose()
    return mine, everywhere


# -- one run ------------------------------------------------------------------------------------


@dataclass
class RunReport:
    name: str
    env: dict[str, str]
    t0: float = 0.0
    well: list[StreamResult] = field(default_factory=list)
    closers: list[StreamResult] = field(default_factory=list)
    slow: list[SlowResult] = field(default_factory=list)
    conv_role: dict[str, str] = field(default_factory=dict)
    conv_result: dict[str, Any] = field(default_factory=dict)
    polls: list[Poll] = field(default_factory=list)
    well_done_at: float = 0.0
    rss_before: float = 0.0
    rss_after: float = 0.0
    rss_with_slow: float = 0.0
    sockets_before: int = 0
    sockets_with_slow: int = 0
    sockets_after: int = 0
    sockets_left: list[str] = field(default_factory=list)  # remote port (whose) after the run
    settle_s: float = 0.0
    engine_after: dict[str, Any] = field(default_factory=dict)
    streaming_mine: int = -1
    streaming_all: int = -1
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    tokens_generated: int = 0
    server: Server | None = None
    checks: list[tuple[str, bool, str, bool]] = field(default_factory=list)  # (.., enforced)


def build_plan(args: argparse.Namespace, seed: int) -> list[tuple[str, float | None]]:
    """(role, close time) for each client: the same plan for both runs."""
    rng = random.Random(seed)
    n_slow = round(args.streams * args.slow_frac)
    n_close = round(args.streams * args.abandon_frac)
    roles = ["abandon"] * n_close + ["well"] * (args.streams - n_slow - n_close)
    rng.shuffle(roles)
    plan: list[tuple[str, float | None]] = [("slow", None)] * n_slow
    for role in roles:
        close = rng.uniform(args.close_min_s, args.close_max_s) if role == "abandon" else None
        plan.append((role, close))
    return plan


async def run_once(
    name: str,
    env: dict[str, str],
    args: argparse.Namespace,
    plan: list[tuple[str, float | None]],
    work: Path,
) -> RunReport:
    folder = work / name.lower()
    folder.mkdir()
    db_url = args.database_url or sqlite_url(folder)
    full_env = {"DATA_DIR": str(folder), "DATABASE_URL": db_url, **env}
    report = RunReport(name, env)
    server = Server(full_env, work / f"server-{name.lower()}.log").start()
    try:
        async with new_client(server.url) as setup:
            user = await signup(setup)
            if not user.get("is_admin"):
                raise SystemExit("the bench user is not the admin: use an empty database")
            # warm-up, so that first-request costs are not in the figures nor in RSS-before
            warm = await new_conversations(setup, 4)
            await asyncio.gather(
                *(stream_reply(setup, c, "[[synthetic:tokens=8]] hi", max_tokens=8) for c in warm)
            )
            conversations = await new_conversations(setup, len(plan))
            cookies = setup.cookies
        # Separate clients, so that the set-up's pooled connections are gone before the baseline.
        async with new_client(server.url) as poll, new_client(server.url) as client:
            poll.cookies, client.cookies = cookies, cookies
            tokens0 = (await engine_snapshot(poll))["tokens_generated"]
            await asyncio.sleep(1.0)
            report.rss_before = server.rss_mb()
            report.sockets_before = client_connections(server)
            stop_poll, stop_slow = asyncio.Event(), asyncio.Event()
            poller = asyncio.create_task(poll_server(poll, server, report.polls, stop_poll))
            report.t0 = time.time()
            slow_tasks, well_tasks, close_tasks = [], [], []
            slow_ports: set[int] = set()
            opener = stream_reply_raw if args.client == "raw" else stream_reply
            for i, ((role, close), conv) in enumerate(zip(plan, conversations, strict=True)):
                report.conv_role[conv] = role
                if role == "slow":
                    body = {
                        "content": f"[[synthetic:tokens={args.slow_tokens}]] slow {i}",
                        "max_tokens": args.slow_tokens,
                    }
                    slow_tasks.append(
                        asyncio.create_task(
                            slow_reader(
                                client,
                                conv,
                                body,
                                rcvbuf=args.slow_rcvbuf,
                                mss=args.slow_mss,
                                window_clamp=args.slow_window_clamp,
                                read_every_s=args.slow_read_s,
                                stop=stop_slow,
                                ports=slow_ports,
                            )
                        )
                    )
                    continue
                if i == len(slow_tasks):  # the slow ones first, so the first batch admits them
                    await asyncio.sleep(0.5)
                content = f"[[synthetic:tokens={args.tokens}]] stream {i}"
                task = asyncio.create_task(
                    opener(client, conv, content, max_tokens=args.tokens, close_after_s=close)
                )
                (close_tasks if role == "abandon" else well_tasks).append((conv, task))
            report.well = [await t for _, t in well_tasks]
            report.well_done_at = time.time()
            report.closers = [await t for _, t in close_tasks]
            for conv, task in [*well_tasks, *close_tasks]:
                report.conv_result[conv] = task.result()

            # Let grace and deadline run out (or, for the control, generation end), then check.
            settle_until = time.time() + args.settle_timeout_s
            while time.time() < settle_until:
                snap = await engine_snapshot(poll)
                if snap["running"] == 0 and snap["waiting"] == 0 and snap["live"] == 0:
                    break
                await asyncio.sleep(0.5)
            report.settle_s = time.time() - report.well_done_at
            await asyncio.sleep(1.0)  # the last final writes
            report.engine_after = await engine_snapshot(poll)
            report.tokens_generated = report.engine_after["tokens_generated"] - tokens0
            report.rss_with_slow = server.rss_mb()
            report.sockets_with_slow = len(set(client_ports(server)) & slow_ports)
            stop_slow.set()
            report.slow = list(await asyncio.gather(*slow_tasks))
            await client.aclose()  # the stream clients' pooled keep-alive connections
            stop_poll.set()
            await poller
            for _ in range(20):  # up to 5 s for the server to notice the closed sockets
                await asyncio.sleep(0.25)
                if client_connections(server) <= report.sockets_before:
                    break
            report.rss_after = server.rss_mb()
            left = client_ports(server)
            report.sockets_after = len(left)
            report.sockets_left = [
                f"{port} ({'slow reader' if port in slow_ports else 'other'})" for port in left
            ]
            report.metrics = await metric_lines(
                poll,
                (
                    "streamchat_aborts_total",
                    "streamchat_deadline_aborts",
                    "streamchat_replies_total",
                ),
            )
        report.streaming_mine, report.streaming_all = await count_streaming(
            db_url, list(report.conv_role)
        )
        report.replies = await stored_replies(db_url, list(report.conv_role), by="conversation_id")
    finally:
        server.stop()
        report.server = server
    return report


# -- reporting ----------------------------------------------------------------------------------


def well_stats(rep: RunReport) -> dict[str, float]:
    ok = [r for r in rep.well if r.final and r.ttft_s is not None]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    p50 = [pct(r.gaps_s, 0.5) * 1000 for r in ok if r.gaps_s]
    p99 = [pct(r.gaps_s, 0.99) * 1000 for r in ok if r.gaps_s]
    pooled = [g * 1000 for r in ok for g in r.gaps_s]
    return {
        "ok": len(ok),
        "ttft_p50": pct(ttft, 0.5),
        "ttft_p99": pct(ttft, 0.99),
        "gap_p50": statistics.median(p50) if p50 else float("nan"),
        "gap_p99": statistics.median(p99) if p99 else float("nan"),
        "gap_pooled_p99": pct(pooled, 0.99),
        "done_s": rep.well_done_at - rep.t0,
    }


def admitted_stats(rep: RunReport) -> dict[str, float]:
    """Engine occupancy while the well-behaved clients were streaming."""
    polls = [p for p in rep.polls if p.t <= rep.well_done_at and p.running is not None]
    running = [p.running for p in polls if p.running is not None]
    waiting = [p.waiting for p in polls if p.waiting is not None]
    return {
        "running_mean": statistics.fmean(running) if running else float("nan"),
        "running_max": max(running, default=0),
        "waiting_max": max(waiting, default=0),
        "rss_peak": max((p.rss_mb for p in rep.polls), default=float("nan")),
    }


def abandoned_cost(rep: RunReport) -> dict[str, float]:
    """Engine time and tokens spent on replies whose client had left (or could not keep up)."""
    slot_s = tokens_after = 0.0
    for conv, role in rep.conv_role.items():
        stored = rep.replies.get(conv)
        if role != "abandon" or not stored:
            continue
        result = rep.conv_result.get(conv)
        closed_at = getattr(result, "closed_at", None)
        if closed_at is None:  # it ended before the client would have closed
            continue
        admitted = stored["first_token_at"]
        end = stored["finished_at"] or time.time()
        if admitted is not None:
            slot_s += max(0.0, end - max(closed_at, admitted))
        received = sum(len((e.data or {}).get("text", "").encode()) for e in result.deltas)
        tokens_after += max(0, stored["completion_tokens"] - received // 4)
    slow_slot_s = slow_tokens = 0.0
    for conv, role in rep.conv_role.items():
        stored = rep.replies.get(conv)
        if role == "slow" and stored and stored["first_token_at"] is not None:
            slow_slot_s += (stored["finished_at"] or time.time()) - stored["first_token_at"]
            slow_tokens += stored["completion_tokens"]
    return {
        "slot_s": slot_s,
        "tokens_after": tokens_after,
        "slow_slot_s": slow_slot_s,
        "slow_tokens": slow_tokens,
    }


def print_timeline(rep: RunReport, every_s: float) -> None:
    rows, next_t, marked = [], 0.0, False
    for p in rep.polls:
        t = p.t - rep.t0
        mark = not marked and p.t >= rep.well_done_at
        if t + 1e-9 < next_t and not mark:
            continue
        next_t = t + every_s
        marked = marked or mark
        rows.append(
            [
                fmt(t, 1),
                "-" if p.running is None else str(p.running),
                "-" if p.waiting is None else str(p.waiting),
                "-" if p.live is None else str(p.live),
                str(p.sockets),
                fmt(p.rss_mb, 1),
                "<- well-behaved clients all done" if mark else "",
            ]
        )
    print_table(["t s", "running", "waiting", "live", "client conns", "RSS MB", ""], rows)


def run_checks(rep: RunReport, args: argparse.Namespace) -> None:
    e = rep.engine_after
    rep.checks = [
        (
            "engine: running=0 and waiting=0 after grace/deadline",
            e.get("running") == 0 and e.get("waiting") == 0,
            f"running={e.get('running')} waiting={e.get('waiting')} "
            f"({rep.settle_s:.1f} s after the well-behaved clients were done)",
            True,
        ),
        ("no live reply left", e.get("live") == 0, f"live={e.get('live')}", True),
        (
            "every reply in a final state",
            rep.streaming_mine == 0,
            f"status='streaming': {rep.streaming_mine} of this run's replies "
            f"({rep.streaming_all} in the whole database)",
            True,
        ),
        (
            "well-behaved clients all completed",
            all((r.final or {}).get("status") == "completed" for r in rep.well),
            f"{sum((r.final or {}).get('status') == 'completed' for r in rep.well)}/{len(rep.well)}"
            + "".join(
                f"; {r.error or f'HTTP {r.status_code}'}"
                for r in rep.well
                if (r.final or {}).get("status") != "completed"
            ),
            False,  # reported, not enforced: not about abandonment (see the server log)
        ),
        (
            "server's client connections back to their count before the run",
            rep.sockets_after <= rep.sockets_before,
            f"before {rep.sockets_before}, after every client closed {rep.sockets_after}"
            + (
                f" (left, by remote port: {', '.join(rep.sockets_left)})"
                if rep.sockets_after > rep.sockets_before
                else ""
            ),
            True,
        ),
        (
            f"RSS back near its start (<= +{args.rss_slack_mb:.0f} MB)",
            rep.rss_after <= rep.rss_before + args.rss_slack_mb,
            f"before {rep.rss_before:.1f} MB, peak {admitted_stats(rep)['rss_peak']:.1f} MB, "
            f"slow still connected {rep.rss_with_slow:.1f} MB, after {rep.rss_after:.1f} MB "
            f"({rep.rss_after - rep.rss_before:+.1f} MB)",
            True,
        ),
    ]


def print_run(rep: RunReport, args: argparse.Namespace) -> None:
    env = " ".join(f"{k}={v}" for k, v in rep.env.items() if k.startswith(("PAGE_", "CLIENT_")))
    print(f"\n== {rep.name}: {env}")
    print_timeline(rep, args.timeline_s)
    states = Counter(
        (rep.conv_role[c], (rep.replies.get(c) or {}).get("status", "?")) for c in rep.conv_role
    )
    print("\nend states in the database (client kind: status x count):")
    for kind in ("well", "abandon", "slow"):
        if kind not in rep.conv_role.values():
            continue
        per = ", ".join(f"{s} x{n}" for (k, s), n in sorted(states.items()) if k == kind)
        print(f"  {kind:8s} {per}")
    slow_read = [s.bytes_read for s in rep.slow]
    slow_rows = [
        rep.replies[c] for c, k in rep.conv_role.items() if k == "slow" and c in rep.replies
    ]
    ended = [r["finished_at"] - rep.t0 for r in slow_rows if r["finished_at"]]
    tokens = [r["completion_tokens"] for r in slow_rows]
    print(
        "slow readers: none"
        if not rep.slow
        else f"slow readers: {len(rep.slow)} read {min(slow_read, default=0)}-{max(slow_read, default=0)} "
        f"bytes each; their replies ended {fmt(min(ended, default=float('nan')))}-"
        f"{fmt(max(ended, default=float('nan')))} s into the run after {min(tokens, default=0)}-"
        f"{max(tokens, default=0)} tokens; the server still held "
        f"{rep.sockets_with_slow} of their connections open once every reply had ended "
        f"(closed by the server: {sum(s.server_closed for s in rep.slow)})"
    )
    for line in rep.metrics:
        if not line.startswith("#"):
            print(f"  {line}")
    run_checks(rep, args)
    print("\npost-run checks:")
    for what, ok, detail, enforced in rep.checks:
        verdict = "PASS" if ok else ("FAIL" if enforced else "WARN")
        print(f"  [{verdict}] {what}: {detail}")


def print_comparison(control: RunReport, real: RunReport) -> None:
    wc, wr = well_stats(control), well_stats(real)
    ac, ar = admitted_stats(control), admitted_stats(real)
    cc, cr = abandoned_cost(control), abandoned_cost(real)
    rows = []

    def row(name: str, c: float, r: float, digits: int = 1) -> None:
        rows.append([name, fmt(c, digits), fmt(r, digits), ratio(r, c)])

    n = len(real.well)
    row(f"well-behaved clients completed (of {n})", wc["ok"], wr["ok"], 0)
    row("well-behaved TTFT p50 (ms)", wc["ttft_p50"], wr["ttft_p50"])
    row("well-behaved TTFT p99 (ms)", wc["ttft_p99"], wr["ttft_p99"])
    row("well-behaved gap p50, median stream (ms)", wc["gap_p50"], wr["gap_p50"])
    row("well-behaved gap p99, median stream (ms)", wc["gap_p99"], wr["gap_p99"])
    row("well-behaved gap p99, all gaps (ms)", wc["gap_pooled_p99"], wr["gap_pooled_p99"])
    row("last well-behaved final at (s)", wc["done_s"], wr["done_s"])
    row("engine running, mean while they streamed", ac["running_mean"], ar["running_mean"])
    row("engine waiting, max", ac["waiting_max"], ar["waiting_max"], 0)
    row("slot-seconds on closed clients' replies", cc["slot_s"], cr["slot_s"])
    row("tokens generated after the client closed", cc["tokens_after"], cr["tokens_after"], 0)
    row("slot-seconds on slow readers' replies", cc["slow_slot_s"], cr["slow_slot_s"])
    row("tokens generated for slow readers", cc["slow_tokens"], cr["slow_tokens"], 0)
    row("engine tokens generated in all", control.tokens_generated, real.tokens_generated, 0)
    row("server RSS before (MB)", control.rss_before, real.rss_before)
    row("server RSS peak (MB)", ac["rss_peak"], ar["rss_peak"])
    row("server RSS after (MB)", control.rss_after, real.rss_after)
    print("\n== CONTROL vs REAL")
    print_table(["metric", "control", "real", "real/control"], rows)


# -- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--abandon-frac", type=float, default=0.20)
    p.add_argument("--slow-frac", type=float, default=0.05)
    p.add_argument("--max-seqs", type=int, default=64, help="ENGINE_MAX_SEQS")
    p.add_argument("--tokens", type=int, default=300, help="reply length, well-behaved/abandoning")
    p.add_argument(
        "--slow-tokens", type=int, default=2400, help="reply length asked by slow readers"
    )
    p.add_argument("--step-ms", type=float, default=10.0, help="SYNTHETIC_STEP_MS")
    p.add_argument("--per-seq-ms", type=float, default=0.25, help="SYNTHETIC_PER_SEQ_MS")
    p.add_argument("--close-min-s", type=float, default=0.5)
    p.add_argument("--close-max-s", type=float, default=10.0)
    p.add_argument("--slow-read-s", type=float, default=0.2, help="a slow reader reads 1 byte per")
    p.add_argument("--slow-rcvbuf", type=int, default=2048, help="slow readers' SO_RCVBUF")
    p.add_argument("--slow-mss", type=int, default=88, help="slow readers' TCP_MAXSEG (0: default)")
    p.add_argument(
        "--slow-window-clamp",
        type=int,
        default=1024,
        help="slow readers' TCP_WINDOW_CLAMP (0: none; the kernel raises it to its minimum)",
    )
    p.add_argument("--grace-s", type=float, default=5.0, help="PAGE_GRACE_S of the real run")
    p.add_argument(
        "--deadline-s", type=float, default=5.0, help="CLIENT_DEADLINE_S of the real run"
    )
    p.add_argument(
        "--settle-timeout-s",
        type=float,
        default=None,
        help="how long to wait for the engine to empty after the well-behaved clients are done "
        "(default: grace + deadline + 15 s for the real run, 60 s for the control)",
    )
    p.add_argument("--rss-slack-mb", type=float, default=30.0)
    p.add_argument("--client", choices=("httpx", "raw"), default="httpx")
    p.add_argument("--timeline-s", type=float, default=3.0, help="timeline row every")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-control", action="store_true")
    p.add_argument("--database-url", default=None, help="default: a fresh SQLite file per run")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (server logs)")
    args = p.parse_args(argv)
    if args.database_url and not args.skip_control:
        print("note: both runs share --database-url; the real run's user will not be the admin")
        print(
            "      (the first user of a database is): pass --skip-control, or two fresh databases"
        )
        return 2

    plan = build_plan(args, args.seed)
    context = max(2048, args.slow_tokens + 256, args.tokens + 256)
    kinds = Counter(role for role, _ in plan)
    common = {
        "ENGINE": "synthetic",
        "ENGINE_MAX_SEQS": str(args.max_seqs),
        # long enough for the slow readers' replies; KV room for max_seqs of them: only max_seqs
        # limits admission
        "ENGINE_CONTEXT": str(context),
        "ENGINE_KV_CELLS": str(args.max_seqs * context + 4096),
        "SYNTHETIC_STEP_MS": str(args.step_ms),
        "SYNTHETIC_PER_SEQ_MS": str(args.per_seq_ms),
    }
    step = args.step_ms + args.per_seq_ms * args.max_seqs
    print(
        f"{args.streams} page streams: {kinds['well']} well-behaved, {kinds['abandon']} closing at "
        f"{args.close_min_s}-{args.close_max_s} s, {kinds['slow']} slow (1 byte / {args.slow_read_s} s, "
        f"SO_RCVBUF {args.slow_rcvbuf}, MSS {args.slow_mss}, {args.slow_tokens}-token replies); "
        f"replies {args.tokens} tokens; engine max_seqs {args.max_seqs}, step {step:.1f} ms when full; "
        f"client {args.client} on {loop_name()}"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-abandon-"))
    reports: dict[str, RunReport] = {}
    try:
        runs = []
        if not args.skip_control:
            runs.append(("CONTROL", {"PAGE_GRACE_S": "3600", "CLIENT_DEADLINE_S": "3600"}, 60.0))
        runs.append(
            (
                "REAL",
                {"PAGE_GRACE_S": str(args.grace_s), "CLIENT_DEADLINE_S": str(args.deadline_s)},
                args.grace_s + args.deadline_s + 15.0,
            )
        )
        for name, env, settle in runs:
            ns = argparse.Namespace(**vars(args))
            ns.settle_timeout_s = args.settle_timeout_s or settle
            if name == "CONTROL":
                print(
                    "\nCONTROL = abortion disabled: the app has no switch, so PAGE_GRACE_S=3600 and "
                    "CLIENT_DEADLINE_S=3600 (closed clients' replies generate to their end; stuck "
                    "clients are never given up on)"
                )
            reports[name] = run_loop(run_once(name, {**common, **env}, ns, plan, work))
            print_run(reports[name], ns)
            if reports[name].server is not None:
                reports[name].server.print_errors()
        if "CONTROL" in reports:
            print_comparison(reports["CONTROL"], reports["REAL"])
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = [what for what, ok, _, enforced in reports["REAL"].checks if enforced and not ok]
    print(
        f"\nREAL run post-run checks: {'all passed' if not failed else 'FAILED: ' + '; '.join(failed)}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
