"""Chat settings: a conversation's and a user's defaults, stored, checked and served."""
