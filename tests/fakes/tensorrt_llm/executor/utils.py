"""FAKE tensorrt_llm.executor.utils: `RequestError`, as defined there (a RuntimeError subclass,
raised for one request's failure: `base_worker._enqueue_request`, `result._handle_response`)."""


class RequestError(RuntimeError):
    """The error raised when the request is failed."""
