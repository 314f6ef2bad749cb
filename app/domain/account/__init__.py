"""A user's own account: their password, their logged-in browsers, every conversation in one file,
who of the admins looked at their conversations, and deleting it all."""
