"""Failure classes the runtime tells apart. Each maps to one path in the record protocol."""

from __future__ import annotations

from aiokafka import errors as kafka


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


class OutputFault(Exception):
    """A record's outputs cannot be built or sent because of what the record holds (a reply_to the
    producer refuses, a value too large, text that does not encode): answered or dead-lettered once,
    never retried. `error_class` is from the fixed vocabulary; the message never quotes the record."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


# Raised by the client or the broker when they cannot reach or keep up with each other: waiting
# helps, whatever the record holds. Authorisation failures count too: an operator fixes the ACL.
_INFRA_KAFKA = (
    kafka.KafkaConnectionError, kafka.KafkaTimeoutError, kafka.NodeNotReadyError, kafka.RequestTimedOutError,
    kafka.NoBrokersAvailable, kafka.KafkaUnavailableError, kafka.BrokerNotAvailableError, kafka.ProducerClosed,
    kafka.TopicAuthorizationFailedError, kafka.ClusterAuthorizationFailedError,
)
# Raised because of the record itself: retrying sends the same bytes to the same refusal.
_RECORD_KAFKA = (kafka.MessageSizeTooLargeError, kafka.RecordTooLargeError, kafka.InvalidTopicError,
                 kafka.CorruptRecordException)


def is_infrastructure(exc: BaseException) -> bool:
    """The broker, the network or the host, not the record: retry for as long as it takes."""
    if isinstance(exc, kafka.KafkaError):
        return not isinstance(exc, _RECORD_KAFKA) and (isinstance(exc, _INFRA_KAFKA) or bool(exc.retriable))
    return isinstance(exc, (OSError, TimeoutError))


def is_record_fault(exc: BaseException) -> bool:
    """What a record's own content causes while its outputs are built or sent: aiokafka's
    `assert partition in ...` (a reply partition the topic lacks), a value over the record limit,
    encoding and validation errors (ValueError covers pydantic's, UnicodeError and JSON's)."""
    if isinstance(exc, kafka.KafkaError):
        return isinstance(exc, _RECORD_KAFKA)
    return isinstance(exc, (OutputFault, AssertionError, ValueError, TypeError, KeyError, IndexError,
                            AttributeError, OverflowError, RecursionError))
