"""A user's conversations: stored, listed, renamed, branched, and their HTTP routes."""
