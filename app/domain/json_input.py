"""Checks on a client's decoded JSON that every entry point shares (the page API's request class
in app/web/client_input.py, the WebSocket's frames): a bad one is a 4xx saying what is wrong."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from app.domain.errors import InvalidInputError

TOO_DEEP = "the JSON is nested too deeply"


class BadJsonError(InvalidInputError):
    """A client's JSON that the app cannot use; the message says why, for the client."""


def text_problem(value: Any) -> str | None:
    """Why some string in a decoded JSON value cannot be stored (keys included), or None.

    Iterative, not recursive: it must not itself trip over deep nesting.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "text must not contain NUL characters (\\u0000)"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "text must be valid Unicode: it contains a lone UTF-16 surrogate"
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
        elif isinstance(item, msgspec.Struct):  # a decoded request: its fields' values
            pending.extend(msgspec.structs.astuple(item))
    return None


def decode_frame(text: str) -> dict[str, Any]:
    """A WebSocket text frame as a JSON object; raises BadJsonError saying what is wrong.

    The standard `json` module, not msgspec: it decodes what msgspec refuses outright (a lone
    surrogate), so that a refusal can still echo the frame's `client_ref`. Its text is not checked
    here (see `text_problem`): the caller does that once it knows which request the frame was.
    """
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise BadJsonError(TOO_DEEP) from exc
    except ValueError as exc:
        raise BadJsonError(f"each frame must be a JSON object ({exc})") from exc
    if not isinstance(value, dict):
        raise BadJsonError("each frame must be a JSON object")
    return value
