"""Finding and keeping conversations: search, export, import and reply ratings."""
