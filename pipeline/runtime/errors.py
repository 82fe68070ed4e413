"""Failure classes the runtime tells apart. Each maps to one path in the record protocol."""

from __future__ import annotations


class StageError(Exception):
    """A stage failed on one record. `error_class` is a fixed, PII-free vocabulary word."""

    error_class = "processing_failed"
    retryable = True

    def __init__(self, message: str, *, error_class: str | None = None) -> None:
        super().__init__(message)
        if error_class:
            self.error_class = error_class


class PermanentError(StageError):
    """Retrying cannot help (bad input for this stage): straight to the DLQ and an error answer."""

    retryable = False


class DecodeError(Exception):
    """The record is not a valid value for the topic: undecodable bytes or schema-invalid JSON."""

    def __init__(self, error_class: str, message: str, raw: object | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.raw = raw  # the parsed JSON when it parsed, to salvage request_id/reply_to


class TopologyError(RuntimeError):
    """The configured topology cannot route a record (unknown stage, no next stage)."""
