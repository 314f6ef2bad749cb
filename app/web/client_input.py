"""What every entry point does with a client's JSON before the app uses it: a bad one is a 4xx.

Decoding can fail in ways the decoders do not report as bad input:

- nesting deeper than the interpreter's recursion limit raises RecursionError, not a decode error,
  in msgspec (what Litestar decodes request bodies with: litestar/serialization/msgspec_hooks.py,
  `decode_json`, turns only `msgspec.DecodeError` into a 400) and in the standard `json` module;
- text the database cannot store decodes fine: `"\\u0000"` (PostgreSQL refuses NUL in text), and,
  with the `json` module, a lone UTF-16 surrogate such as `"\\ud800"` (not encodable as UTF-8,
  so neither database, nor llama.cpp's tokenizer, accepts it; msgspec already refuses those).

`SafeRequest` (the app's request class) turns all of these into a 400 for every JSON body, and a
client that leaves while its body is being read into a quiet 499; `decode_frame` does the same for
the WebSocket's frames (app/domain/json_input.py), whose bad ones are answered with one `rejected` frame.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request
from litestar.exceptions import ClientException, HTTPException, InternalServerException

from app.domain.json_input import TOO_DEEP, text_problem

log = logging.getLogger(__name__)

HTTP_CLIENT_CLOSED_REQUEST = 499  # nginx's name for "the client went away before the answer"


class ClientDisconnectedError(HTTPException):
    """The client closed the connection while its request body was still being read."""

    status_code = HTTP_CLIENT_CLOSED_REQUEST
    detail = "the client disconnected before sending its whole request body"


class SafeRequest(Request):
    """Litestar's Request, with the two holes above closed for every JSON body the app reads."""

    async def body(self) -> bytes:
        try:
            return await super().body()
        except InternalServerException as exc:
            # litestar/connection/request.py, Request.stream: the one InternalServerException it
            # raises is on `http.disconnect` mid-body ("client disconnected prematurely"). That is
            # the client's doing, not a server error: answer 499 (nobody reads it), log one line.
            log.info(
                "%s %s: the client left while its body was being read", self.method, self.url.path
            )
            raise ClientDisconnectedError() from exc

    async def json(self) -> Any:
        try:
            value = await super().json()
        except RecursionError as exc:
            raise ClientException(TOO_DEEP) from exc
        if (problem := text_problem(value)) is not None:
            raise ClientException(problem)
        return value
