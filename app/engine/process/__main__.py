"""Serve the engine that the ENGINE_* settings name to web workers on ENGINE_SOCKET.

    ENGINE=llamacpp ENGINE_SOCKET=/run/streamchat/engine.sock python -m app.engine.process

Runs until SIGTERM or SIGINT, then ends every open request `cancelled` and unlinks the socket.
The workers run with ENGINE=process and the same ENGINE_SOCKET (app/engine/process/client.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal

from app.engine import create_engine
from app.engine.process.server import EngineServer
from app.settings import EngineSettings


async def serve(settings: EngineSettings) -> None:
    if not settings.socket_path:
        raise SystemExit("ENGINE_SOCKET names the socket to serve the engine on")
    if settings.kind == "process":
        raise SystemExit(
            "ENGINE names the engine to serve here (llamacpp, trtllm, ...), not process"
        )
    engine = create_engine(settings)
    await engine.start()
    server = EngineServer(engine, settings.socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await server.start()
        print(f"engine {engine.model_name} serving on {settings.socket_path}", flush=True)
        await stop.wait()
    finally:
        await server.close()
        await engine.shutdown()


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = EngineSettings.from_env()
    try:
        import uvloop  # the web workers' loop too (scripts/serve's uvicorn picks it when installed)

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(settings))


if __name__ == "__main__":
    main()
