"""Every setting, read from the environment in one place.

Engine settings live in their own dataclass so that the engine package can be configured without
knowing about the web app.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class EngineSettings:
    kind: str = "llamacpp"  # llamacpp | trtllm | synthetic | openai
    # a GGUF (llamacpp), a model dir/name (trtllm) or the upstreams' model name (openai; None:
    # the first of GET /v1/models); None: SmolLM2
    model_path: str | None = None
    context_size: int = 2048  # tokens one sequence may hold: prompt + reply
    # Sequences decoding at once; the rest wait (fairly across users). On llama.cpp the KV pool
    # bounds admission first (a request enters once its whole reply fits); ids are cheap.
    max_seqs: int = 64
    kv_cells: int = 16384  # KV cache size in tokens, shared by all running sequences
    # Every CPU. On a 2-CPU machine, 8 streams through the whole server made 207 tok/s with 2
    # threads against 135 with 1, gaps 33 ms against 54, and the same ~0 ms delivery overhead:
    # the web server's loop still gets its turns because libgomp's barrier spinning is bounded
    # (GOMP_SPINCOUNT, see app/engine/llamacpp/native.py). On a hyper-threaded host, the physical core count
    # may do better.
    threads: int = max(1, os.cpu_count() or 1)
    # Chunked prefill, by time (app/engine/llamacpp/step_clock.py): a step that carries prompt chunks
    # beside decoding streams may last `step_stretch` times a decode-only step, or
    # `step_floor_ms` where that is longer; with nobody decoding, a step takes up to
    # `max_step_tokens` of waiting prompts at once. With 8 streams decoding and a 1,500-token
    # prompt arriving, 2.0 keeps their gaps within ~2-3x the steady one (bench/chunked_prefill.py).
    step_stretch: float = 2.0
    step_floor_ms: float = 100.0
    max_step_tokens: int = 1024
    # TensorRT-LLM's executor in this process (TLLM_WORKER_USE_SINGLE_PROCESS=1) or, the default,
    # in its worker process: TensorRT-LLM warns that in-process may hurt streaming (app/engine/trtllm/engine.py)
    trtllm_in_process: bool = False
    synthetic_step_ms: float = 20.0  # synthetic engine: fixed cost of one step
    synthetic_per_seq_ms: float = 0.5  # ... plus this much per running sequence
    synthetic_prefill_ms_per_token: float = 0.05
    # ENGINE=openai (app/engine/openai/engine.py): OpenAI-compatible inference servers, each
    # named by its API base (http://host:port/v1), with an optional bearer key for all of them.
    upstreams: tuple[str, ...] = ()
    upstream_key: str | None = None
    # Requests sent to one upstream at once; the rest wait in the app (a queued request whose
    # client goes away is still prefilled by llama-server later). 0: its /props `total_slots`,
    # or max_seqs where the server does not say.
    upstream_slots: int = 0
    upstream_connect_timeout_s: float = 3.0
    # Until the response headers and the first text: llama-server sends no header before the
    # request has a slot and its first token. Also the longest silence mid-reply.
    upstream_first_token_timeout_s: float = 60.0
    upstream_failures_to_down: int = 2  # consecutive failures that mark an upstream down
    upstream_probe_interval_s: float = 2.0  # health checks of every upstream, up or down

    @classmethod
    def from_env(cls) -> EngineSettings:
        d = cls()
        return cls(
            kind=_env("ENGINE", d.kind),
            model_path=os.environ.get("MODEL_PATH") or None,
            context_size=_env_int("ENGINE_CONTEXT", d.context_size),
            max_seqs=_env_int("ENGINE_MAX_SEQS", d.max_seqs),
            kv_cells=_env_int("ENGINE_KV_CELLS", d.kv_cells),
            threads=_env_int("ENGINE_THREADS", d.threads),
            step_stretch=_env_float("ENGINE_STEP_STRETCH", d.step_stretch),
            step_floor_ms=_env_float("ENGINE_STEP_FLOOR_MS", d.step_floor_ms),
            max_step_tokens=_env_int("ENGINE_MAX_STEP_TOKENS", d.max_step_tokens),
            trtllm_in_process=_env_bool("TRTLLM_IN_PROCESS", d.trtllm_in_process),
            synthetic_step_ms=_env_float("SYNTHETIC_STEP_MS", d.synthetic_step_ms),
            synthetic_per_seq_ms=_env_float("SYNTHETIC_PER_SEQ_MS", d.synthetic_per_seq_ms),
            synthetic_prefill_ms_per_token=_env_float(
                "SYNTHETIC_PREFILL_MS_PER_TOKEN", d.synthetic_prefill_ms_per_token
            ),
            upstreams=tuple(
                url.strip().rstrip("/")
                for url in _env("ENGINE_UPSTREAMS", "").split(",")
                if url.strip()
            ),
            upstream_key=os.environ.get("ENGINE_UPSTREAM_KEY") or None,
            upstream_slots=_env_int("ENGINE_UPSTREAM_SLOTS", d.upstream_slots),
            upstream_connect_timeout_s=_env_float(
                "ENGINE_UPSTREAM_CONNECT_TIMEOUT_S", d.upstream_connect_timeout_s
            ),
            upstream_first_token_timeout_s=_env_float(
                "ENGINE_UPSTREAM_FIRST_TOKEN_TIMEOUT_S", d.upstream_first_token_timeout_s
            ),
            upstream_failures_to_down=_env_int(
                "ENGINE_UPSTREAM_FAILURES_TO_DOWN", d.upstream_failures_to_down
            ),
            upstream_probe_interval_s=_env_float(
                "ENGINE_UPSTREAM_PROBE_INTERVAL_S", d.upstream_probe_interval_s
            ),
        )


def _default_database_url() -> str:
    data = Path(_env("DATA_DIR", "data")).resolve()
    return f"sqlite+aiosqlite:///{data / 'streamchat.db'}"


@dataclass(frozen=True)
class Settings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    database_url: str = field(default_factory=_default_database_url)
    secret_key: str = field(default_factory=lambda: secrets.token_hex(32))
    keepalive_s: float = 15.0  # SSE comment / WS ping when a stream is idle
    page_grace_s: float = 5.0  # how long a page reply waits for its client to resume
    api_grace_s: float = 0.0  # same for /v1: OpenAI clients never resume
    client_deadline_s: float = 30.0  # a subscriber that takes nothing this long is gone
    flush_interval_s: float = 1.0  # partial text reaches the database at least this often
    replica_id: str = "main"  # names this process among replicas sharing one database
    session_store_url: str | None = None  # redis://... shares log-in sessions between replicas
    max_message_chars: int = 16000
    default_max_tokens: int = 512
    debug: bool = False
    # Cookies marked Secure: "auto" when the request came over https (uvicorn takes the scheme
    # from a trusted proxy's X-Forwarded-Proto), or "true" / "false" always.
    cookie_secure: str = "auto"
    # Log-in and sign-up limits (app/domain/accounts/ratelimit.py): attempts counted when they
    # start, in a sliding window, per client address and per account.
    login_window_s: float = 900.0
    login_max_per_address: int = 20  # failed log-ins from one address, whatever the account
    login_max_per_account: int = 5  # failed log-ins on one account from one address (or device)
    login_max_per_account_total: int = 100  # ... from unknown devices, all addresses together
    signup_window_s: float = 3600.0
    signup_max_per_address: int = 10
    rate_limit_namespace: str = "streamchat-ratelimit"  # key prefix in SESSION_STORE_URL's Redis
    metrics_token: str | None = None  # GET /metrics needs `Authorization: Bearer <token>` when set
    # Live replies (running or waiting in the engine) one user may have in this process; more are
    # refused with 429 / a `rejected` frame, so that one user cannot fill every engine slot. 0: off.
    max_replies_per_user: int = 8
    final_save_wait_s: float = 5.0  # longest a client's `final` waits for the reply to be saved

    @classmethod
    def from_env(cls) -> Settings:
        d = cls(secret_key="unused")
        return cls(
            engine=EngineSettings.from_env(),
            database_url=os.environ.get("DATABASE_URL") or _default_database_url(),
            secret_key=os.environ.get("SECRET_KEY") or secrets.token_hex(32),
            keepalive_s=_env_float("KEEPALIVE_S", d.keepalive_s),
            page_grace_s=_env_float("PAGE_GRACE_S", d.page_grace_s),
            api_grace_s=_env_float("API_GRACE_S", d.api_grace_s),
            client_deadline_s=_env_float("CLIENT_DEADLINE_S", d.client_deadline_s),
            flush_interval_s=_env_float("FLUSH_INTERVAL_S", d.flush_interval_s),
            replica_id=_env("REPLICA_ID", d.replica_id),
            session_store_url=os.environ.get("SESSION_STORE_URL") or None,
            max_message_chars=_env_int("MAX_MESSAGE_CHARS", d.max_message_chars),
            default_max_tokens=_env_int("DEFAULT_MAX_TOKENS", d.default_max_tokens),
            debug=_env_bool("DEBUG", d.debug),
            cookie_secure=_env("COOKIE_SECURE", d.cookie_secure).strip().lower(),
            login_window_s=_env_float("LOGIN_WINDOW_S", d.login_window_s),
            login_max_per_address=_env_int("LOGIN_MAX_PER_ADDRESS", d.login_max_per_address),
            login_max_per_account=_env_int("LOGIN_MAX_PER_ACCOUNT", d.login_max_per_account),
            login_max_per_account_total=_env_int(
                "LOGIN_MAX_PER_ACCOUNT_TOTAL", d.login_max_per_account_total
            ),
            signup_window_s=_env_float("SIGNUP_WINDOW_S", d.signup_window_s),
            signup_max_per_address=_env_int("SIGNUP_MAX_PER_ADDRESS", d.signup_max_per_address),
            rate_limit_namespace=_env("RATE_LIMIT_NAMESPACE", d.rate_limit_namespace),
            metrics_token=os.environ.get("METRICS_TOKEN") or None,
            max_replies_per_user=_env_int("MAX_REPLIES_PER_USER", d.max_replies_per_user),
            final_save_wait_s=_env_float("FINAL_SAVE_WAIT_S", d.final_save_wait_s),
        )
