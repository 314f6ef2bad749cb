"""The long-lived objects one app instance holds, built and torn down by the app's lifespan."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.broadcast import Broadcast, broadcast_for
from app.db.cancel_channel import CancelChannel, cancel_channel_for
from app.db.engine import create_engine as create_db_engine
from app.db.engine import make_sessionmaker, pool_options
from app.db.session import Sessions
from app.db.storage import StorageHealth, watch_storage
from app.domain.accounts.access import AccessCache
from app.domain.chat.conversations.service import ConversationService
from app.domain.chat.push.events import UserPush
from app.domain.chat.replies.ledger import DatabaseLedger
from app.domain.chat.replies.limits import ReplyLimits
from app.domain.chat.replies.service import ReplyService
from app.domain.chat.sign_outs import SignOuts
from app.domain.quotas.service import Limits, Quotas
from app.engine import Engine, create_engine
from app.settings import Settings
from app.streaming import metrics, relay
from app.streaming.manager import GenerationManager
from app.streaming.pacing import DeliveryPacer
from app.streaming.push import PushHub

log = logging.getLogger(__name__)

PUSH_CHANNEL = "streamchat_user_events"
STORAGE_CHECK_S = 2.0


@dataclass
class Services:
    settings: Settings
    db_engine: AsyncEngine
    sessions: Sessions
    engine: Engine
    manager: GenerationManager
    cancel_channel: CancelChannel  # how the replicas tell each other about replies
    replies: ReplyService
    quotas: Quotas  # each user's token quotas (reserved at a reply's start, settled at its end)
    conversations: ConversationService
    push: UserPush  # each user's events, to every page they have open
    push_relay: Broadcast  # ... on every replica
    storage: StorageHealth  # whether the database takes writes (disk full, read-only)
    access: AccessCache  # whether an account still allows its sessions (at most 1 s old)
    sign_outs: SignOuts  # a signed-out user's sockets, push channels and replies, ended at once
    engine_ready: asyncio.Event = field(default_factory=asyncio.Event)
    engine_error: str | None = None
    _engine_start: asyncio.Task[None] | None = None
    _storage_watch: asyncio.Task[None] | None = None

    @classmethod
    def build(cls, settings: Settings, engine: Engine | None = None) -> Services:
        db_engine = create_db_engine(
            settings.database_url,
            busy_timeout_s=settings.database_busy_timeout_s,
            **pool_options(
                settings.database_pool_size,
                settings.database_max_overflow,
                settings.database_pool_recycle_s,
            ),
        )
        sessions = make_sessionmaker(db_engine)
        storage = StorageHealth(settings.database_url, on_change=metrics.storage_changed)
        watch_storage(db_engine, storage)
        engine = engine or create_engine(settings.engine)
        metrics.watch_engine(engine.stats)
        cancel_channel = cancel_channel_for(settings.database_url, sessions)
        quotas = Quotas(
            sessions, Limits(settings.quota_tokens_per_day, settings.quota_tokens_per_month)
        )
        manager = GenerationManager(
            engine,
            DatabaseLedger(sessions, cancel_channel, settings.replica_id, quotas),
            flush_interval_s=settings.flush_interval_s,
            client_deadline_s=settings.client_deadline_s,
            final_wait_s=settings.final_save_wait_s,
            pacer=DeliveryPacer(
                max_tick_s=settings.delivery_tick_max_ms / 1000,
                busy=settings.delivery_loop_busy,
            ),
        )
        push_relay = broadcast_for(settings.database_url, PUSH_CHANNEL)
        hub: PushHub = PushHub(max_per_user=settings.push_max_channels_per_user or None)
        push = UserPush(hub, manager, push_relay.publish if push_relay.relays else None)
        access = AccessCache(sessions)
        replies = ReplyService(
            sessions,
            manager,
            limits=ReplyLimits(settings.default_max_tokens, settings.max_message_chars),
            keepalive_s=settings.keepalive_s,
            page_grace_s=settings.page_grace_s,
            api_grace_s=settings.api_grace_s,
            replica_id=settings.replica_id,
            max_replies_per_user=settings.max_replies_per_user,
            push=push,
            quotas=quotas,
        )
        return cls(
            settings,
            db_engine,
            sessions,
            engine,
            manager,
            cancel_channel,
            replies,
            quotas,
            ConversationService(sessions, manager, push),
            push,
            push_relay,
            storage=storage,
            access=access,
            sign_outs=SignOuts(manager, push, access),
        )

    async def start(self) -> None:
        await self.manager.start()  # first closes what a previous run left streaming
        # What other replicas publish about replies (a Stop, a client watching) acts on ours.
        await self.cancel_channel.start(functools.partial(relay.receive, self.manager))
        await self.push_relay.start(self.push.receive)  # other replicas' users' events
        self.sign_outs.start()
        # The model loads in the background: meanwhile the server answers, /readyz says
        # "loading" and a reply request gets a clear 503 (the engine refuses until started).
        self._engine_start = asyncio.create_task(self._start_engine(), name="engine-start")
        self._storage_watch = asyncio.create_task(self._watch_storage(), name="storage-watch")

    async def _watch_storage(self) -> None:
        """Every few seconds: SQLite's free space always (a statvfs), PostgreSQL only while it
        refuses writes, so that /readyz, /metrics and the admin see the state, and its end,
        without waiting for a write to fail or succeed."""
        while True:
            await asyncio.sleep(STORAGE_CHECK_S)
            if self.storage.sqlite_dir is not None or self.storage.problem is not None:
                try:
                    await self.storage.check(self.db_engine)
                except Exception:  # the database away altogether: /readyz says so
                    log.debug("storage check failed", exc_info=True)

    async def _start_engine(self) -> None:
        try:
            await self.engine.start()
        except Exception as exc:
            log.exception("the engine failed to start")
            self.engine_error = f"{type(exc).__name__}: {exc}"
            return
        self.engine_ready.set()
        log.info("engine %s ready", self.engine.model_name)

    async def stop(self) -> None:
        if self._storage_watch is not None:
            self._storage_watch.cancel()
        await self.sign_outs.stop()
        await self.access.close()
        await self.cancel_channel.stop()
        await self.push_relay.stop()
        self.push.close()
        await self.manager.shutdown(self.settings.shutdown_save_deadline_s)
        if self._engine_start is not None:
            await asyncio.wait({self._engine_start})  # never shut down an engine mid-load
        await self.engine.shutdown()
        await self.db_engine.dispose()
