"""What the model is shown: a turn's branch fitted to the context, in steps, by token counts."""
