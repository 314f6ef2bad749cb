"""The admin console's pages: conversations of every user, one conversation, live replies, charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from litestar import Controller, Request, get, post
from litestar.di import NamedDependency
from litestar.exceptions import ClientException, NotFoundException
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from app.db.session import Sessions
from app.db.storage import StorageHealth
from app.domain.accounts import service as accounts
from app.domain.accounts.guards import admin_guard
from app.domain.admin import queries
from app.domain.admin.acting import acting_admin, record_look
from app.domain.admin.charts import histogram_svg, ratings_per_day_svg, states_over_time_svg
from app.domain.admin.tree_view import conversation_tree
from app.domain.admin.views import kill_reply, live_generations, storage_alert
from app.domain.chat import chat_settings, ratings
from app.domain.chat.models import Rating
from app.domain.chat.replies import ReplyService
from app.domain.json_input import text_problem
from app.engine import Engine
from app.streaming.events import Status

PAGE_SIZE = 25
MAX_PAGE = 1_000_000
"""Pages past this are clamped to it (then to the last page): a hand-made `?page=10**20` must not
reach the database as an OFFSET neither SQLite nor PostgreSQL can hold (a 64-bit integer)."""


def _parse_date(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    except ValueError as exc:
        raise ClientException(f"{name} must be a date (YYYY-MM-DD)") from exc


def _day_after(day: datetime | None) -> datetime | None:
    """The exclusive end of an inclusive end date; None (no end) after the last representable
    day, 9999-12-31, when there is no day after it."""
    if day is None:
        return None
    try:
        return day + timedelta(days=1)
    except OverflowError:
        return None


class AdminPages(Controller):
    path = "/admin"
    guards = [admin_guard]
    include_in_schema = False

    @get("/")
    async def index(
        self,
        sessions: NamedDependency[Sessions],
        user: FromQuery[str | None] = None,
        status: FromQuery[str | None] = None,
        date_from: FromQuery[str | None] = None,
        date_to: FromQuery[str | None] = None,
        q: FromQuery[str | None] = None,
        rating: FromQuery[str | None] = None,
        page: FromQuery[int] = 1,
    ) -> Template:
        if status and status not in {s.value for s in Status}:
            raise ClientException(f"unknown status {status!r}")
        if rating and rating not in {r.value for r in Rating}:
            raise ClientException(f"unknown rating {rating!r}")
        try:
            user_id = UUID(user) if user else None
        except ValueError as exc:
            raise ClientException("user must be a user id") from exc
        if q and (problem := text_problem(q)) is not None:
            raise ClientException(f"q: {problem}")
        filters = queries.ConversationFilter(
            user_id=user_id,
            status=Status(status) if status else None,
            updated_after=_parse_date(date_from, "date_from"),
            updated_before=_day_after(_parse_date(date_to, "date_to")),  # inclusive end date
            search=q.strip() if q and q.strip() else None,
            rating=Rating(rating) if rating else None,
        )
        page = min(max(1, page), MAX_PAGE)
        result = await queries.admin_list_conversations(
            sessions, filters, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE
        )
        last_page = max(1, -(-result.total // PAGE_SIZE))
        if page > last_page:  # past the end (a stale or hand-made link): show the last page
            page = last_page
            result = await queries.admin_list_conversations(
                sessions, filters, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE
            )
        rows = [
            {
                "id": str(row.conversation.id),
                "title": row.conversation.title,
                "source": str(row.conversation.source),
                "user_email": row.user_email,
                "updated_at": row.conversation.updated_at,
                "message_count": row.message_count,
                "last_status": str(row.last_status) if row.last_status else None,
                "pinned": row.conversation.pinned_at is not None,  # its owner's filing
                "archived": row.conversation.archived_at is not None,
            }
            for row in result.items
        ]
        users = [{"id": str(u.id), "email": u.email} for u in await accounts.list_users(sessions)]
        return Template(
            "admin/index.html",
            context=dict(
                conversations=rows,
                filters={
                    "user": user,
                    "status": status,
                    "date_from": date_from,
                    "date_to": date_to,
                    "q": q,
                    "rating": rating,
                },
                page=page,
                pages=last_page,
                total=result.total,
                users=users,
                statuses=[s.value for s in Status],
                ratings=[r.value for r in Rating],
            ),
        )

    @get("/conversations/{conversation_id:uuid}")
    async def conversation(
        self, request: Request, sessions: NamedDependency[Sessions], conversation_id: FromPath[UUID]
    ) -> Template:
        conversation = await queries.get_conversation_unscoped(sessions, conversation_id)
        if conversation is None:
            raise NotFoundException("no such conversation")
        await record_look(
            request, sessions, "view_conversation", conversation.user_id, conversation_id
        )
        messages = await queries.admin_list_messages(sessions, conversation_id)
        owner = await accounts.get_user(sessions, conversation.user_id)
        chosen = await chat_settings.for_conversation(sessions, conversation_id)
        given = await ratings.ratings_of_messages(sessions, [m.id for m in messages])
        rated = {str(r.message_id): {"rating": str(r.rating), "comment": r.comment} for r in given}
        return Template(
            "admin/conversation.html",
            context=dict(
                conversation={
                    "id": str(conversation.id),
                    "title": conversation.title,
                    "source": str(conversation.source),
                    "user_email": owner.email if owner else "(deleted)",
                    "created_at": conversation.created_at,
                    "updated_at": conversation.updated_at,
                    "pinned_at": conversation.pinned_at,
                    "archived_at": conversation.archived_at,
                },
                tree=conversation_tree(conversation, messages),
                settings={"system_prompt": chosen.system_prompt, "sampling": chosen.given()},
                ratings=rated,  # message id -> the owner's rating (one per reply and user)
            ),
        )

    @get("/live")
    async def live(
        self,
        replies: NamedDependency[ReplyService],
        engine: NamedDependency[Engine],
        storage: NamedDependency[StorageHealth],
    ) -> Template:
        emails = {str(u.id): u.email for u in await accounts.list_users(replies.sessions)}
        generations = live_generations(replies.manager, emails)
        return Template(
            "admin/live.html",
            context=dict(
                generations=generations,
                engine_stats=engine.stats(),
                storage=storage_alert(storage),
            ),
        )

    @post("/live/{message_id:uuid}/kill", status_code=303)
    async def kill(
        self, request: Request, replies: NamedDependency[ReplyService], message_id: FromPath[UUID]
    ) -> Redirect:
        """The kill switch (a form post): abort a reply wherever it runs (audited)."""
        await kill_reply(replies, message_id, await acting_admin(request, replies.sessions))
        return Redirect("/admin/live", status_code=303)

    @get("/charts")
    async def charts(self, sessions: NamedDependency[Sessions]) -> Template:
        timings = await queries.recent_reply_timings(sessions)
        hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        hours = [hour - timedelta(hours=i) for i in range(47, -1, -1)]
        counts = await queries.message_status_counts(sessions, since=hours[0], bucket="hour")
        today = hour.replace(hour=0)
        days = [today - timedelta(days=i) for i in range(13, -1, -1)]
        rated = await queries.rating_counts_per_day(sessions, since=days[0])
        return Template(
            "admin/charts.html",
            context=dict(
                ttft_svg=histogram_svg(timings.ttft_ms, "Time to first token (engine)"),
                gap_svg=histogram_svg(timings.gap_p50_ms, "Inter-token gap, median per reply"),
                gap_p99_svg=histogram_svg(timings.gap_p99_ms, "Inter-token gap, p99 per reply"),
                states_svg=states_over_time_svg(
                    [(c.bucket_start, str(c.status), c.count) for c in counts],
                    "Replies by end state, per hour (last 48 h)",
                    hours,
                ),
                ratings_svg=ratings_per_day_svg(
                    [(c.day, str(c.rating), c.count) for c in rated],
                    "Reply ratings, per day (last 14 days)",
                    days,
                ),
            ),
        )
