"""Ways in: the Python client (and, later, the OpenAI-compatible HTTP front door)."""

from pipeline.ingress.client import Client, ClientTimeout

__all__ = ["Client", "ClientTimeout"]
