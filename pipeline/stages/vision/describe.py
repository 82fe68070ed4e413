"""What a text-only model is told about the images: a description of each (its top labels) by a
revisioned template, added to the conversation as a message of its own."""

from __future__ import annotations

from pipeline.contracts.request import ChatMessage, ImageFeatures

TEMPLATES = {"img-desc-v1": "[image {n}: {labels}]"}


def describe(images: list[ImageFeatures], template_revision: str) -> str:
    t = TEMPLATES[template_revision]
    return " ".join(t.format(n=f.index + 1, labels=", ".join(f"{lab} {s:.2f}" for lab, s in zip(f.labels, f.scores)))
                    for f in images)


def with_description(messages: list[ChatMessage], description: str) -> list[ChatMessage]:
    """The conversation with the description as a user message of its own, just before the caller's
    last user message (the question about the images); the caller's messages stay as they were."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=len(messages))
    return [*messages[:last_user], ChatMessage(role="user", content=description), *messages[last_user:]]
