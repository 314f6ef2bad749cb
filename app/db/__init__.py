"""Database plumbing: engine and session wiring, the declarative base, Alembic migrations.

Nothing here knows about chats or users; the domain packages (`app.domain.*`) hold the models and
the queries. `app.db.models` imports every model so that Alembic sees the whole schema.
"""
