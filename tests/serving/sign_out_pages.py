"""A user's open page as the sign-out tests see it (tests/serving/test_live_sign_out*.py): a
WebSocket subscribed to the user's events, read in the background with the time of each frame
and of the server's close; and a `GET /api/events` stream, read likewise."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.live_server import PageClient, SseComment, SseReader

LONG = "[[synthetic:tokens=100000]] Tell me everything."


def cookie_header(client: PageClient) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in client.http.cookies.items())}


class SocketPage:
    """One page's `/ws`, subscribed: every frame in order, and how and when the server closed it."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.closed_at: float | None = None
        self._closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        received = None
        try:
            while True:
                self.frames.put(json.loads(self.ws.recv()))
        except ConnectionClosed as closed:
            received = closed.rcvd
        finally:
            self.close_code = received.code if received is not None else None
            self.closed_at = time.monotonic()
            self._closed.set()

    def send(self, payload: dict[str, Any]) -> None:
        self.ws.send(json.dumps(payload))

    def take(self, timeout_s: float = 10.0) -> dict[str, Any]:
        frame = self.frames.get(timeout=timeout_s)
        self.seen.append(frame)
        return frame

    def take_until(self, kind: str, timeout_s: float = 10.0, **fields: Any) -> dict[str, Any]:
        """Frames up to the first of type `kind` (with those `fields`); returns that one."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                frame = self.take(max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {kind} {fields} frame; got {self.seen[-5:]}") from None
            if frame["type"] == kind and all(frame.get(k) == v for k, v in fields.items()):
                return frame

    def wait_closed(self, timeout_s: float = 10.0) -> tuple[int | None, float]:
        """Wait for the server's close; every frame before it is then in `seen`."""
        assert self._closed.wait(timeout_s), "the server did not close the socket"
        assert self.closed_at is not None
        with contextlib.suppress(queue.Empty):
            while True:
                self.seen.append(self.frames.get_nowait())
        return self.close_code, self.closed_at

    @property
    def open(self) -> bool:
        return not self._closed.is_set()

    def text_of(self, message_id: str) -> str:
        return "".join(
            f["text"]
            for f in self.seen
            if f["type"] == "delta" and f.get("message_id", message_id) == message_id
        )

    def events(self) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in f.items() if k != "type"} for f in self.seen if f["type"] == "event"
        ]


@contextlib.contextmanager
def socket_page(ws_url: str, client: PageClient) -> Iterator[SocketPage]:
    with connect(ws_url, additional_headers=cookie_header(client), open_timeout=10) as ws:
        ws.send(json.dumps({"type": "subscribe"}))
        page = SocketPage(ws)
        assert page.take()["type"] == "ping"  # subscribed: it hears every event from here on
        yield page


class EventStream:
    """One `GET /api/events`: its events in order, and when the server ended it."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.read()
        self.reader = SseReader(response)
        self.items: queue.Queue[dict[str, Any]] = queue.Queue()
        self.ended_at: float | None = None
        self._ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):
            for item in self.reader:
                self.items.put({"heartbeat": True} if isinstance(item, SseComment) else item.json())
        self.ended_at = time.monotonic()
        self._ended.set()

    def next_event(self, timeout_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            item = self.items.get(timeout=max(0.01, deadline - time.monotonic()))
            if "event" in item:
                return item

    def events_within(self, wait_s: float) -> list[dict[str, Any]]:
        deadline, found = time.monotonic() + wait_s, []
        with contextlib.suppress(queue.Empty):
            while (left := deadline - time.monotonic()) > 0:
                item = self.items.get(timeout=left)
                if "event" in item:
                    found.append(item)
        return found

    def wait_ended(self, timeout_s: float = 10.0) -> float:
        assert self._ended.wait(timeout_s), "the server did not end the event stream"
        assert self.ended_at is not None
        return self.ended_at

    def rest(self) -> list[dict[str, Any]]:
        """The events not taken yet (after `wait_ended`: all of them, to the end)."""
        found = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self.items.get_nowait()
                if "event" in item:
                    found.append(item)
        return found

    @property
    def ended(self) -> bool:
        return self._ended.is_set()


@contextlib.contextmanager
def event_stream(base_url: str, client: PageClient) -> Iterator[EventStream]:
    with (
        httpx.Client(base_url=base_url, cookies=client.http.cookies, timeout=60) as http,
        http.stream("GET", "/api/events") as response,
    ):
        stream = EventStream(response)
        assert stream.items.get(timeout=10) == {"heartbeat": True}  # subscribed
        yield stream
