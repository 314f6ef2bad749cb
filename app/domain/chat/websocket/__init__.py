"""The page's WebSocket: its frames both ways and its route."""
