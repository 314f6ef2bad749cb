"""Several tabs and devices, against a real server (synthetic engine, 10 ms steps), on SQLite and
PostgreSQL: each page's one push channel (`/ws` after `subscribe`, or `GET /api/events`) hears the user's
replies start and end on their other pages, and conversations created, renamed and deleted; a page
resumes a reply started elsewhere and stops it from there; another user's channels hear nothing.
The frames are asserted exactly."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.live_server import LiveServer, PageClient, SseComment, SseReader, read_stream

LONG = "[[synthetic:tokens=100000]] Tell me everything."


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": 10}


class Channel:
    """One page's push channel, read in the background: every frame it got, in order."""

    def __init__(self) -> None:
        self.items: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []  # everything taken so far, heartbeats included

    def take(self, timeout_s: float = 10.0) -> dict[str, Any]:
        item = self.items.get(timeout=timeout_s)
        self.seen.append(item)
        return item

    def wait_subscribed(self) -> None:
        """The channel's first heartbeat: from now on it hears every event."""
        assert self.take() == {"heartbeat": True}

    def next_event(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The next push event, skipping heartbeats."""
        deadline = time.monotonic() + timeout_s
        while True:
            item = self.take(max(0.01, deadline - time.monotonic()))
            if "event" in item:
                return item

    def events_within(self, wait_s: float) -> list[dict[str, Any]]:
        """Every push event that arrives within `wait_s`."""
        deadline = time.monotonic() + wait_s
        found = []
        with contextlib.suppress(queue.Empty):
            while (left := deadline - time.monotonic()) > 0:
                item = self.take(left)
                if "event" in item:
                    found.append(item)
        return found

    def events_seen(self) -> list[dict[str, Any]]:
        return [item for item in self.seen if "event" in item]


class WsChannel(Channel):
    def __init__(self, ws: ClientConnection) -> None:
        super().__init__()
        self.ws = ws
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()  # the socket's reply frames
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):
            for raw in self.ws:
                frame = json.loads(raw)
                if frame["type"] == "ping":
                    self.items.put({"heartbeat": True})
                elif frame["type"] == "event":
                    self.items.put({k: v for k, v in frame.items() if k != "type"})
                else:  # a reply's own frame (start, delta, final)
                    self.replies.put(frame)

    def send(self, payload: dict[str, Any]) -> None:
        self.ws.send(json.dumps(payload))

    def reply_frames(self, message_id: str, until: str = "final") -> list[dict[str, Any]]:
        """This socket's frames of one reply, read until one of type `until`."""
        frames = []
        while not frames or frames[-1]["type"] != until:
            frame = self.replies.get(timeout=10)
            if frame.get("message_id") == message_id:
                frames.append(frame)
        return frames


class SseChannel(Channel):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__()
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        self.reader = SseReader(response)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):
            for item in self.reader:
                if isinstance(item, SseComment):
                    self.items.put({"heartbeat": True})
                else:
                    data = item.json()
                    assert item.event == data["event"] and item.id is None, item
                    self.items.put(data)


def cookie_header(client: PageClient) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in client.http.cookies.items())}


@contextlib.contextmanager
def ws_channel(server: LiveServer, client: PageClient) -> Iterator[WsChannel]:
    with connect(server.ws_url, additional_headers=cookie_header(client), open_timeout=10) as ws:
        ws.send(json.dumps({"type": "subscribe"}))
        ws.send(json.dumps({"type": "subscribe"}))  # a second one changes nothing
        channel = WsChannel(ws)
        channel.wait_subscribed()
        yield channel


@contextlib.contextmanager
def sse_channel(server: LiveServer, client: PageClient) -> Iterator[SseChannel]:
    # Its own connection (the test's client goes on making requests meanwhile).
    with (
        httpx.Client(base_url=server.url, cookies=client.http.cookies, timeout=60) as http,
        http.stream("GET", "/api/events") as response,
    ):
        channel = SseChannel(response)
        channel.wait_subscribed()
        yield channel


def test_two_pages_of_one_user_hear_each_other_and_another_user_hears_nothing(
    server: LiveServer, alice: PageClient, bob: PageClient
) -> None:
    """Alice has a page on the WebSocket and one on SSE; Bob has one of each too. Alice's
    conversation is created, renamed, gets a reply (sent on her socket) that her other page
    resumes and stops, and is deleted: both her pages hear exactly that, Bob's nothing."""
    with (
        ws_channel(server, alice) as tab1,
        sse_channel(server, alice) as tab2,
        ws_channel(server, bob) as bob_ws,
        sse_channel(server, bob) as bob_sse,
    ):
        conversation = alice.new_conversation()
        created = {"event": "conversation_created", "conversation_id": conversation}
        created["title"] = "New chat"
        assert tab1.next_event() == created
        assert tab2.next_event() == created

        renamed = alice.http.patch(
            f"/api/conversations/{conversation}",
            json={"title": "Plans for the weekend"},
            headers=alice.csrf_headers(),
        )
        assert renamed.status_code == 200, renamed.text
        renamed_event = {
            "event": "conversation_renamed",
            "conversation_id": conversation,
            "title": "Plans for the weekend",
        }
        assert tab1.next_event() == renamed_event
        assert tab2.next_event() == renamed_event

        # Tab 1 sends; tab 2 hears of it, follows it from the start and stops it.
        tab1.send({"type": "send", "conversation_id": conversation, "content": LONG,
                   "max_tokens": 2000, "client_ref": "tab1"})  # fmt: skip
        started = tab2.next_event()
        assert started == {
            "event": "reply_started",
            "conversation_id": conversation,
            "message_id": started["message_id"],
        }
        message_id = started["message_id"]
        assert tab1.next_event() == started  # the sending page hears it too (and ignores it)
        with alice.resume(message_id, 0) as resumed:
            reader = SseReader(resumed)
            for item in reader:  # tab 2 sees the reply streaming...
                if getattr(item, "event", None) == "delta":
                    break
            stop = alice.cancel(message_id)  # ...and stops it
            assert stop.status_code == 200 and stop.json()["status"] == "cancelled", stop.text
            tail = read_stream(reader)
        assert tail.end is not None and tail.end.json()["status"] == "cancelled"
        frames = tab1.reply_frames(message_id)  # tab 1's own stream ends stopped
        assert frames[0]["type"] == "start" and frames[0]["client_ref"] == "tab1"
        assert frames[-1]["status"] == "cancelled"
        ended = {
            "event": "reply_ended",
            "conversation_id": conversation,
            "message_id": message_id,
            "status": "cancelled",
        }
        assert tab1.next_event() == ended
        assert tab2.next_event() == ended

        deleted = alice.http.delete(
            f"/api/conversations/{conversation}", headers=alice.csrf_headers()
        )
        assert deleted.status_code == 204, deleted.text
        gone = {"event": "conversation_deleted", "conversation_id": conversation}
        assert tab1.next_event() == gone
        assert tab2.next_event() == gone

        # Bob's own event reaches his pages only (his channels work: their silence means something).
        bobs = bob.new_conversation()
        bob_created = {"event": "conversation_created", "conversation_id": bobs}
        bob_created["title"] = "New chat"
        assert bob_ws.next_event() == bob_created
        assert bob_sse.next_event() == bob_created
        assert tab1.events_within(0.5) == [] and tab2.events_within(0.1) == []
        assert bob_ws.events_seen() == [bob_created] and bob_sse.events_seen() == [bob_created]
        assert bob_ws.events_within(0.1) == [] and bob_sse.events_within(0.1) == []


def test_a_chat_named_by_its_first_message_and_an_imported_one_are_heard(
    server: LiveServer, alice: PageClient
) -> None:
    """Published by the services, not the routes: the rename a first message makes goes out
    before its reply starts (a page then needs no refetch for the title), and an import is a
    created conversation like any other."""
    with sse_channel(server, alice) as tab:
        conversation = alice.new_conversation()
        assert tab.next_event()["event"] == "conversation_created"
        with alice.send(conversation, "Plans for the weekend [[synthetic:tokens=3]]") as sent:
            stream = read_stream(SseReader(sent))
        assert stream.end is not None
        renamed = {"event": "conversation_renamed", "conversation_id": conversation}
        renamed["title"] = "Plans for the weekend [[synthetic:tokens=3]]"
        assert tab.next_event() == renamed
        started = tab.next_event()
        assert started["event"] == "reply_started" and started["message_id"] == stream.message_id
        assert tab.next_event()["event"] == "reply_ended"
        with alice.send(conversation, "And the next one? [[synthetic:tokens=3]]") as sent:
            read_stream(SseReader(sent))
        assert [e["event"] for e in tab.events_within(0.5)] == ["reply_started", "reply_ended"]

        exported = alice.http.get(f"/api/conversations/{conversation}/export?format=json")
        imported = alice.post(
            "/api/conversations/import",
            content=exported.content,
            json_body=None,
            headers={"content-type": "application/json"},
        )
        assert imported.status_code == 201, imported.text
        created = {"event": "conversation_created", "conversation_id": imported.json()["id"]}
        created["title"] = imported.json()["title"]
        assert tab.next_event() == created


def test_a_reply_sent_over_sse_is_followed_and_stopped_on_another_pages_socket(
    server: LiveServer, alice: PageClient, bob: PageClient
) -> None:
    """Stop works from any page: a reply POSTed by one page streams on another page's socket
    (resumed there from offset 0 on hearing `reply_started`) and is stopped from it."""
    conversation = alice.new_conversation()
    with ws_channel(server, alice) as tab1, ws_channel(server, bob) as bob_ws:
        with alice.send(conversation, LONG, max_tokens=2000) as response:
            reader = SseReader(response)
            assert tab1.next_event()["event"] == "conversation_renamed"  # its first message
            started = tab1.next_event()
            assert started["event"] == "reply_started"
            message_id = started["message_id"]
            tab1.send({"type": "resume", "message_id": message_id, "after": 0})
            frames = tab1.reply_frames(message_id, until="delta")
            assert frames[0]["type"] == "start" and frames[0]["id"] == 0
            tab1.send({"type": "cancel", "message_id": message_id})
            sent = read_stream(reader)  # the sending page's own stream ends stopped
        assert sent.message_id == message_id
        assert sent.end is not None and sent.end.json()["status"] == "cancelled"
        followed = tab1.reply_frames(message_id)
        assert followed[-1]["type"] == "final" and followed[-1]["status"] == "cancelled"
        text = "".join(f["text"] for f in frames + followed if f["type"] == "delta")
        assert text == sent.text  # the same reply, whole, on both pages
        assert tab1.next_event()["event"] == "reply_ended"
        assert bob_ws.events_within(0.3) == []


def test_a_page_that_connects_mid_reply_hears_it_at_once(
    server: LiveServer, alice: PageClient
) -> None:
    """A page opened while a reply streams (or reconnecting) hears `reply_started` for it first."""
    conversation = alice.new_conversation()
    with alice.send(conversation, LONG, max_tokens=2000) as response:
        reader = SseReader(response)
        for item in reader:
            if getattr(item, "event", None) == "start":
                message_id = item.json()["message_id"]
                break
        with sse_channel(server, alice) as late:
            assert late.next_event() == {
                "event": "reply_started",
                "conversation_id": conversation,
                "message_id": message_id,
            }
            assert alice.cancel(message_id).status_code == 200
            assert late.next_event()["event"] == "reply_ended"
        read_stream(reader)


def test_the_push_stream_needs_a_logged_in_user(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.get("/api/events").status_code == 401
