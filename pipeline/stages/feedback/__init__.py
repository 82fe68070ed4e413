"""Feedback: a worker that authenticates the giver, masks the text and joins feedback to its request."""
