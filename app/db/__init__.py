"""Database plumbing: engine and session wiring, the declarative base, Alembic migrations.

Nothing here knows about chats or users; the domain packages (`app.domain.*`) hold the models and
the queries. `migrations/env.py` imports every model so that Alembic sees the whole schema.
"""
