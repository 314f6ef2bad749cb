"""Every setting, read from the environment in one place.

Each field names its environment variable once (`env("NAME", default)`); `from_env()` reads
those variables and msgspec converts and checks them (`msgspec.convert(..., strict=False)` turns
"2048" into an int and "true"/"0" into a bool), so a bad value stops the start with the variable's
name and what was expected. An empty variable counts as unset. Engine settings live in their own
dataclass so that the engine package can be configured without knowing about the web app.
"""

from __future__ import annotations

import os
import secrets
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

T = TypeVar("T")

# Words that mean a boolean, beside msgspec's own "true"/"false"/"1"/"0" (any case).
_BOOLEAN_WORDS = {"yes": "true", "on": "true", "no": "false", "off": "false"}


class SettingsError(ValueError):
    """An environment variable that does not hold what its setting needs."""


def env(name: str, default: Any = MISSING, *, default_factory: Any = MISSING) -> Any:
    """A dataclass field read from the environment variable `name` by `read_env`."""
    return field(default=default, default_factory=default_factory, metadata={"env": name})


def read_env(cls: type[T], environ: Mapping[str, str] | None = None, **given: Any) -> T:
    """`cls` with each `env(...)` field taken from `environ` (default: the process's), the rest
    from `given` or their defaults. Lists (tuple fields) are comma-separated; booleans and choices
    are read case-insensitively."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    raw: dict[str, Any] = {}
    names: dict[str, str] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        name = f.metadata.get("env")
        value = (environ.get(name) or "").strip() if name else ""
        if not value:
            continue
        names[f.name] = name
        hint = hints[f.name]
        if typing.get_origin(hint) is tuple:
            value = [item.strip() for item in value.split(",") if item.strip()]
        elif hint is bool:
            value = _BOOLEAN_WORDS.get(value.lower(), value.lower())
        elif typing.get_origin(hint) is Literal:
            value = value.lower()
        raw[f.name] = value
    try:
        return msgspec.convert({**raw, **given}, cls, strict=False)
    except msgspec.ValidationError as exc:
        problem, _, where = str(exc).rpartition(" - at ")
        variable = names.get(where.strip("`").removeprefix("$."), where)
        raise SettingsError(f"{variable}: {problem or exc}") from None


@dataclass(frozen=True)
class EngineSettings:
    kind: str = env("ENGINE", "llamacpp")  # llamacpp | trtllm | synthetic | openai | process
    # a GGUF (llamacpp), a model dir/name (trtllm) or the upstreams' model name (openai; None:
    # the first of GET /v1/models); None: SmolLM2
    model_path: str | None = env("MODEL_PATH", None)
    # Tokens one sequence may hold, prompt + reply; 0: the model's trained context (GGUF
    # n_ctx_train; TensorRT-LLM: the model config, as its KV cache allows), capped by the KV pool
    context_size: int = env("ENGINE_CONTEXT", 0)
    # Sequences decoding at once; the rest wait (fairly across users). On llama.cpp the KV pool
    # bounds admission first (a request enters once its whole reply fits); ids are cheap.
    max_seqs: int = env("ENGINE_MAX_SEQS", 64)
    # KV cache size in tokens, shared by all running sequences
    kv_cells: int = env("ENGINE_KV_CELLS", 16384)
    # llama.cpp's KV layout. "unified": one pool any sequence may use (admission by free cells;
    # the prefix cache shares cells in the pool). "streams": a stream of kv_cells / max_seqs
    # cells per sequence, as llama-server's `--parallel N` gives (each query walks only its own
    # cells: 1.26x the unified pool's tok/s at 32 streams in bench/kv_layout.py); that is also
    # each sequence's context, so size kv_cells as max_seqs x the context wanted. Its prefix
    # cache keeps finished sequences' states in host memory, up to prefix_cache_mb.
    kv_layout: Literal["unified", "streams"] = env("ENGINE_KV_LAYOUT", "unified")
    # Where the unified pool's prefix cache keeps finished sequences' prefixes: "host" (saved
    # states in host memory, as with streams, up to prefix_cache_mb: the pool's cells hold only
    # running sequences, and a query walks only as far as they reach), or "pool" (their cells
    # stay in the pool, shared by tagging, at most an eighth of it: no copy, but every query of
    # every step walks past them). Host: 1.16-1.25x the tok/s of 16 users' multi-turn chats,
    # half the cells walked after mixed traffic (bench/README.md, issue 25 item 3).
    prefix_cache_store: Literal["host", "pool"] = env("ENGINE_PREFIX_CACHE_STORE", "host")
    prefix_cache_mb: int = env("ENGINE_PREFIX_CACHE_MB", 1024)
    # Every CPU. On a 2-CPU machine, 8 streams through the whole server made 207 tok/s with 2
    # threads against 135 with 1, gaps 33 ms against 54, and the same ~0 ms delivery overhead:
    # the web server's loop still gets its turns because libgomp's barrier spinning is bounded
    # (GOMP_SPINCOUNT, see app/engine/llamacpp/native.py). On a hyper-threaded host, the physical core count
    # may do better.
    threads: int = env("ENGINE_THREADS", max(1, os.cpu_count() or 1))
    # Chunked prefill, by time (app/engine/llamacpp/step_clock.py): a step that carries prompt chunks
    # beside decoding streams may last `step_stretch` times a decode-only step, or
    # `step_floor_ms` where that is longer; with nobody decoding, a step takes up to
    # `max_step_tokens` of waiting prompts at once. With 8 streams decoding and a 1,500-token
    # prompt arriving, 2.0 keeps their gaps within ~2-3x the steady one (bench/chunked_prefill.py).
    step_stretch: float = env("ENGINE_STEP_STRETCH", 2.0)
    step_floor_ms: float = env("ENGINE_STEP_FLOOR_MS", 100.0)
    max_step_tokens: int = env("ENGINE_MAX_STEP_TOKENS", 1024)
    # TensorRT-LLM's executor in this process (TLLM_WORKER_USE_SINGLE_PROCESS=1) or, the default,
    # in its worker process: TensorRT-LLM warns that in-process may hurt streaming
    # (app/engine/trtllm/engine.py)
    trtllm_in_process: bool = env("TRTLLM_IN_PROCESS", False)
    # Synthetic engine: fixed cost of one step
    synthetic_step_ms: float = env("SYNTHETIC_STEP_MS", 20.0)
    # ... plus this much per running sequence
    synthetic_per_seq_ms: float = env("SYNTHETIC_PER_SEQ_MS", 0.5)
    synthetic_prefill_ms_per_token: float = env("SYNTHETIC_PREFILL_MS_PER_TOKEN", 0.05)
    # ENGINE=openai (app/engine/openai/engine.py): OpenAI-compatible inference servers, each
    # named by its API base (http://host:port/v1), with an optional bearer key for all of them.
    upstreams: tuple[str, ...] = env("ENGINE_UPSTREAMS", ())
    upstream_key: str | None = env("ENGINE_UPSTREAM_KEY", None)
    # Requests sent to one upstream at once; the rest wait in the app (a queued request whose
    # client goes away is still prefilled by llama-server later). 0: its /props `total_slots`,
    # or max_seqs where the server does not say.
    upstream_slots: int = env("ENGINE_UPSTREAM_SLOTS", 0)
    upstream_connect_timeout_s: float = env("ENGINE_UPSTREAM_CONNECT_TIMEOUT_S", 3.0)
    # Until the response headers and the first text: llama-server sends no header before the
    # request has a slot and its first token (a long prompt's prefill included).
    upstream_first_token_timeout_s: float = env("ENGINE_UPSTREAM_FIRST_TOKEN_TIMEOUT_S", 60.0)
    # The longest silence mid-reply, once text flows: past it the server is taken as hung (the
    # reply ends failed with its text so far). Other requests' prefill may pause a reply for a
    # few seconds on a busy server, not for this long.
    upstream_stall_timeout_s: float = env("ENGINE_UPSTREAM_STALL_TIMEOUT_S", 15.0)
    # Consecutive failures that mark an upstream down: health checks, or requests (counted apart)
    upstream_failures_to_down: int = env("ENGINE_UPSTREAM_FAILURES_TO_DOWN", 2)
    # Health checks of every upstream, up or down
    upstream_probe_interval_s: float = env("ENGINE_UPSTREAM_PROBE_INTERVAL_S", 2.0)
    # The engine in its own process, shared by web workers (app/engine/process/): its Unix
    # socket, in a folder only the service's user may enter. `python -m app.engine.process`
    # serves the engine the other ENGINE_* settings name (its own ENGINE is not `process`) on it;
    # each worker runs with ENGINE=process and the same ENGINE_SOCKET.
    socket_path: str | None = env("ENGINE_SOCKET", None)
    # How long a worker waits at start for the engine process to answer (it may be loading)
    process_wait_s: float = env("ENGINE_PROCESS_WAIT_S", 300.0)

    def __post_init__(self) -> None:
        # An API base is named without its trailing slash (the paths are appended to it).
        object.__setattr__(self, "upstreams", tuple(url.rstrip("/") for url in self.upstreams))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineSettings:
        return read_env(cls, environ)


def _default_database_url() -> str:
    data = Path(os.environ.get("DATA_DIR") or "data").resolve()
    return f"sqlite+aiosqlite:///{data / 'streamchat.db'}"


@dataclass(frozen=True)
class Settings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    database_url: str = env("DATABASE_URL", default_factory=_default_database_url)
    # How long a SQLite write waits for another connection's write lock before it fails (SQLite's
    # busy timeout; PostgreSQL waits for its locks)
    database_busy_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = env(
        "DATABASE_BUSY_TIMEOUT_S", 5.0
    )
    # Connections one process keeps to the database, and how many more it may open while those are
    # all taken (closed again when handed back; a request waits 30 s at most for one, then gets
    # a 503). A burst of sends queues here: each holds its connection for its few round trips
    # (app/db/engine.py), so 20 in all keep ahead of one event loop's set-ups unless the
    # database is far away. Keep the sum, times the replicas, under PostgreSQL's
    # max_connections (100 by default).
    database_pool_size: Annotated[int, msgspec.Meta(ge=1)] = env("DATABASE_POOL_SIZE", 10)
    database_max_overflow: Annotated[int, msgspec.Meta(ge=0)] = env("DATABASE_MAX_OVERFLOW", 10)
    # A pooled connection older than this is closed and opened again at its next check-out (no
    # check-out pings the server: app/db/engine.py). Below a proxy's or firewall's idle timeout,
    # no connection it dropped silently is used again (one idle that long is older than this).
    database_pool_recycle_s: Annotated[float, msgspec.Meta(gt=0)] = env(
        "DATABASE_POOL_RECYCLE_S", 1800.0
    )
    secret_key: str = env("SECRET_KEY", default_factory=lambda: secrets.token_hex(32))
    keepalive_s: float = env("KEEPALIVE_S", 15.0)  # SSE comment / WS ping when a stream is idle
    # How long a page reply waits for its client to resume
    page_grace_s: float = env("PAGE_GRACE_S", 5.0)
    api_grace_s: float = env("API_GRACE_S", 0.0)  # same for /v1: OpenAI clients never resume
    # A subscriber that takes nothing this long is gone
    client_deadline_s: float = env("CLIENT_DEADLINE_S", 30.0)
    # When the event loop's thread is busy more than DELIVERY_LOOP_BUSY of the time, a client
    # gets new text at most once per tick (up to DELIVERY_TICK_MAX_MS), merged: fewer, larger
    # events, so one process keeps up with a GPU engine (app/streaming/pacing.py). 0: never.
    delivery_tick_max_ms: Annotated[float, msgspec.Meta(ge=0)] = env("DELIVERY_TICK_MAX_MS", 100.0)
    delivery_loop_busy: Annotated[float, msgspec.Meta(gt=0, le=1)] = env("DELIVERY_LOOP_BUSY", 0.8)
    # Partial text reaches the database at least this often
    flush_interval_s: float = env("FLUSH_INTERVAL_S", 1.0)
    # Names this process among replicas sharing one database
    replica_id: str = env("REPLICA_ID", "main")
    # Redis://... shares log-in sessions between replicas
    session_store_url: str | None = env("SESSION_STORE_URL", None)
    max_message_chars: int = env("MAX_MESSAGE_CHARS", 16000)
    default_max_tokens: int = env("DEFAULT_MAX_TOKENS", 512)
    debug: bool = env("DEBUG", False)
    # Cookies marked Secure: "auto" when the request came over https (uvicorn takes the scheme
    # from a trusted proxy's X-Forwarded-Proto), or "true" / "false" always.
    cookie_secure: Literal["auto", "true", "false"] = env("COOKIE_SECURE", "auto")
    # Log-in and sign-up limits (app/domain/accounts/ratelimit.py): attempts counted when they
    # start, in a sliding window, per client address and per account.
    login_window_s: float = env("LOGIN_WINDOW_S", 900.0)
    # Failed log-ins from one address, whatever the account
    login_max_per_address: int = env("LOGIN_MAX_PER_ADDRESS", 20)
    # Failed log-ins on one account from one address (or device)
    login_max_per_account: int = env("LOGIN_MAX_PER_ACCOUNT", 5)
    # ... from unknown devices, all addresses together
    login_max_per_account_total: int = env("LOGIN_MAX_PER_ACCOUNT_TOTAL", 100)
    # Who may make an account (app/domain/accounts/signup.py): anyone ("open"), anyone, to be
    # approved by an admin before use ("approval"), holders of an admin's invitation link
    # ("invite"), nobody but admins ("closed"). The first account is the admin in every mode.
    signup_mode: Literal["open", "approval", "invite", "closed"] = env("SIGNUP_MODE", "approval")
    signup_window_s: float = env("SIGNUP_WINDOW_S", 3600.0)
    signup_max_per_address: int = env("SIGNUP_MAX_PER_ADDRESS", 10)
    # Key prefix in SESSION_STORE_URL's Redis
    rate_limit_namespace: str = env("RATE_LIMIT_NAMESPACE", "streamchat-ratelimit")
    # Proxies trusted for X-Forwarded-For/-Proto and the trusted sign-in header, judged on the
    # connection's own peer (app/web/proxy_peer.py); the same variable uvicorn reads
    forwarded_allow_ips: tuple[str, ...] = env("FORWARDED_ALLOW_IPS", ("127.0.0.1", "::1"))
    # A header a trusted proxy (oauth2-proxy, Authelia...) signs users in by, naming their email:
    # honoured only from FORWARDED_ALLOW_IPS (app/domain/accounts/trusted_header.py). None: off
    auth_trusted_email_header: str | None = env("AUTH_TRUSTED_EMAIL_HEADER", None)
    # GET /metrics needs `Authorization: Bearer <token>` when set
    metrics_token: str | None = env("METRICS_TOKEN", None)
    # Live replies (running or waiting in the engine) one user may have in this process; more are
    # refused with 429 / a `rejected` frame, so that one user cannot fill every engine slot. 0: off.
    max_replies_per_user: int = env("MAX_REPLIES_PER_USER", 8)
    # Push channels (WebSocket subscriptions and GET /api/events) one user may have open in this
    # process; a new one past it ends the oldest with a `resync` (reason "evicted"). 0: no cap.
    push_max_channels_per_user: int = env("PUSH_MAX_CHANNELS_PER_USER", 16)
    # Tokens (prompt + completion, as the engine counts them) one user may use per UTC day and
    # per UTC month; 0: no limit. An admin overrides them per user (app/domain/quotas/).
    quota_tokens_per_day: Annotated[int, msgspec.Meta(ge=0)] = env("QUOTA_TOKENS_PER_DAY", 0)
    quota_tokens_per_month: Annotated[int, msgspec.Meta(ge=0)] = env("QUOTA_TOKENS_PER_MONTH", 0)
    # Longest a client's `final` waits for the reply to be saved
    final_save_wait_s: float = env("FINAL_SAVE_WAIT_S", 5.0)
    # On SIGTERM, how long the replies' final saves still pending are retried before they are
    # logged as lost (the next start marks them `interrupted`)
    shutdown_save_deadline_s: Annotated[float, msgspec.Meta(ge=0)] = env(
        "SHUTDOWN_SAVE_DEADLINE_S", 10.0
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        return read_env(cls, environ, engine=EngineSettings.from_env(environ))
