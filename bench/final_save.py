"""What the single, retrying final writer (app/streaming/saving.py) costs when nothing stalls.

Every reply's end is saved by one writer, one save at a time (so that a stalled database costs
one pooled connection, not one per ended reply). The worst case for that is many replies ending
in the same engine step: N synthetic streams of the same length, started together. For each,
the client measures end-to-final latency (last delta to the `final` event: the final write is
on that path, since the final waits for the save) and the whole burst's wall time.

The baseline, measured in the same run, is the code before this change (`--baseline-rev`,
default 6b40b3d: each reply's pump saved its own final, concurrently), exported with
`git archive` and served from that copy with the same virtual environment.

    python bench/final_save.py [--levels 64,256] [--tokens 50] [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import serving_overhead as so  # bench/ is on sys.path when this script runs
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]


def export_tree(rev: str, into: Path) -> Path:
    """The repository at `rev`, as files (no .git), to serve the baseline from."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


async def run_on_server(admin_url: str, statement: str) -> None:
    """One statement (CREATE or DROP DATABASE) on the PostgreSQL server of `admin_url`."""
    dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def create_database(admin_url: str) -> str:
    name = f"streamchat_bench_{uuid.uuid4().hex[:8]}"
    await run_on_server(admin_url, f'CREATE DATABASE "{name}"')
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


async def drop_database(url: str, admin_url: str) -> None:
    name = make_url(url).database
    await run_on_server(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def burst(url: str, n: int, tokens: int) -> tuple[list[float], float, int]:
    """N streams started together: (end-to-final latencies, burst wall time, finals with
    saved=false)."""
    async with so.new_client(url) as client:
        await so.signup(client)
        conversations = await so.new_conversations(client, n)
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(
                so.stream_reply(client, c, so.synthetic_content(tokens)(i), start=start)
            )
            for i, c in enumerate(conversations)
        ]
        await asyncio.sleep(0.5)
        began = time.time()
        start.set()
        results = await asyncio.gather(*tasks)
    latencies, last, unsaved = [], began, 0
    for r in results:
        finals = [e for e in r.events if e.name == "final"]
        if not finals or not r.deltas:
            raise RuntimeError(f"a stream did not end well: {r.error or r.status_code}")
        latencies.append(finals[0].t - r.deltas[-1].t)
        last = max(last, finals[0].t)
        unsaved += finals[0].data.get("saved") is False
    return latencies, last - began, unsaved


def serve(tree: Path, database_url: str, folder: Path, n: int) -> so.Server:
    so.ROOT = tree  # Server runs migrations and uvicorn from this folder
    env = {
        "ENGINE": "synthetic",
        "DATABASE_URL": database_url,
        "DATA_DIR": str(folder),
        "ENGINE_MAX_SEQS": str(n),
        "ENGINE_KV_CELLS": str(n * 400),
        "SYNTHETIC_STEP_MS": "10",
        "PAGE_GRACE_S": "30",
        "CLIENT_DEADLINE_S": "60",
    }
    return so.Server(env, folder / "server.log").start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="64,256")
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--baseline-rev", default="6b40b3d")
    parser.add_argument("--database-url", help="a PostgreSQL server: a database per run is made")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="final-save-") as tmp:
        base = export_tree(args.baseline_rev, Path(tmp) / "baseline")
        for n in levels:
            figures = {}
            for label, tree in (("baseline", base), ("one writer", ROOT)):
                folder = Path(tmp) / f"{label.replace(' ', '-')}-{n}"
                folder.mkdir()
                if args.database_url:
                    url = asyncio.run(create_database(args.database_url))
                else:
                    url = so.sqlite_url(folder)
                server = serve(tree, url, folder, n)
                try:
                    latencies, wall, unsaved = so.run_loop(burst(server.url, n, args.tokens))
                finally:
                    server.stop()
                    if args.database_url:
                        asyncio.run(drop_database(url, args.database_url))
                figures[label] = (latencies, wall, unsaved)
            for label, (latencies, wall, unsaved) in figures.items():
                base_wall = figures["baseline"][1]
                rows.append(
                    [
                        str(n),
                        label,
                        so.fmt(so.median(latencies) * 1000),
                        so.fmt(so.pct(latencies, 0.99) * 1000),
                        so.fmt(max(latencies) * 1000),
                        so.fmt(wall, 2),
                        so.ratio(wall, base_wall),
                        str(unsaved),
                    ]
                )
    database = "PostgreSQL" if args.database_url else "SQLite"
    print(f"\n{database}, {args.tokens}-token synthetic replies ending in the same step:")
    so.print_table(
        [
            "streams",
            "code",
            "end->final p50 ms",
            "p99 ms",
            "max ms",
            "burst wall s",
            "vs baseline",
            "saved=false",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
