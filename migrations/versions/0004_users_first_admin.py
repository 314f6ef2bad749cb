"""At most one account becomes admin by being the first to sign up.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Concurrent sign-ups on an empty instance could each see no users and each make itself admin.
`first_admin` is TRUE for the one account made admin that way and NULL for every other; a unique
index lets only one row hold TRUE (NULLs never collide, on SQLite and PostgreSQL alike), so the
database itself refuses a second first admin.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("first_admin", sa.Boolean(), nullable=True))
    op.create_index("uq_users_first_admin", "users", ["first_admin"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_users_first_admin", table_name="users")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("first_admin")
