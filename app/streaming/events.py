"""What a subscriber receives, independent of the wire format.

Event ids are character offsets into the reply: a `Delta` with id 42 ends at character 42. That makes
resume exact from memory *and* from the database (the persisted text is the same string), so a
client that says `Last-Event-ID: 42` gets `text[42:]`, nothing missing and nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """A reply's state: `streaming` while it runs, then exactly one of the final ones.

    Replies are stored with it too: its values are in the database's CHECK constraint, so a new
    one needs a migration.
    """

    STREAMING = "streaming"  # being generated; partial text flushed about once a second
    COMPLETED = "completed"  # stop token or stop string (and every user message)
    LENGTH = "length"  # hit max tokens or the context size
    CANCELLED = "cancelled"  # the user (or the admin) pressed Stop
    DISCONNECTED = "disconnected"  # the client went away and did not come back
    FAILED = "failed"  # engine or server error
    INTERRUPTED = "interrupted"  # the server stopped mid-reply (at shutdown, or marked at start)

    @property
    def is_final(self) -> bool:
        return self is not Status.STREAMING


class CancelCause(StrEnum):
    """Why a reply was aborted; decides its final status."""

    USER = "user"  # Stop button, WS cancel, POST .../cancel
    ADMIN = "admin"  # the admin console's kill switch
    DISCONNECT = "disconnect"  # the client left and did not come back within the grace period
    DEADLINE = "deadline"  # the client took nothing for too long while text was pending
    SHUTDOWN = "shutdown"  # the server is stopping
    SIGNED_OUT = "signed_out"  # the account was disabled, deleted or its password reset

    @property
    def status(self) -> Status:
        if self in (CancelCause.USER, CancelCause.ADMIN, CancelCause.SIGNED_OUT):
            return Status.CANCELLED
        if self is CancelCause.SHUTDOWN:
            return Status.INTERRUPTED
        return Status.DISCONNECTED


@dataclass(frozen=True, slots=True)
class Delta:
    id: int  # character offset where this text ends
    text: str


@dataclass(frozen=True, slots=True)
class Final:
    id: int  # the reply's full length in characters
    status: Status
    finish_reason: str | None
    usage: dict[str, int]
    timings: dict[str, float | None]
    error: str | None = None
    # False: the reply has ended (this is its whole text and true end state) but the database
    # has not taken it yet; the server keeps retrying (see app/streaming/saving.py).
    saved: bool = True
    context_size: int | None = None  # the engine's context (None: replayed from the database)


@dataclass(frozen=True, slots=True)
class Start:
    """First event of a stream: which rows it belongs to, and where in the reply it starts."""

    id: int
    message_id: str
    conversation_id: str
    user_message_id: str | None = None


StreamEvent = Start | Delta | Final
