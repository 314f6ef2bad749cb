"""Frames between web workers and the engine process: a 4-byte length, then a pickle.

Pickle because both ends are this code and the socket is private: the engine process creates it
with mode 0600 and a client talks only to a socket its own user owns (`check_owner`), so nothing
another local user wrote is ever unpickled. Events are the engine contract's own dataclasses.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!I")


def encode(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def read(reader: asyncio.StreamReader) -> Any:
    """The next frame; `asyncio.IncompleteReadError` at the end of the stream."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(size))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("the engine process closed the connection")
        chunks += chunk
    return bytes(chunks)


def receive(sock: socket.socket) -> Any:
    """Blocking: the next frame from `sock` (its timeout applies)."""
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    return pickle.loads(_recv_exactly(sock, size))


def check_owner(path: str) -> None:
    """Refuse a socket that another user owns: it could feed us any pickle."""
    owner = os.stat(path).st_uid
    if owner != os.getuid():
        raise PermissionError(f"{path} belongs to uid {owner}, not to this process's user")
