"""Python client for OpenAI-compatible servers, with Andes' token pacer (Andes §5)."""

from andante.client.client import ClientError, PacedStream, StreamingClient, StreamResult
from andante.client.pacer import PacedToken, TokenPacer

__all__ = [
    "ClientError",
    "PacedStream",
    "PacedToken",
    "StreamResult",
    "StreamingClient",
    "TokenPacer",
]
