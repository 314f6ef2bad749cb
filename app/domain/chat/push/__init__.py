"""What a user's other pages are told: the events and the SSE channel that carries them."""
