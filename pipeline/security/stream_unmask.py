"""Un-masking a stream: placeholders restored whole, even when the engine splits one across pieces.

A streamed answer arrives in pieces ("<EMAIL_", "ADDRESS_1> is"), so restoring each piece alone
would send the caller a placeholder fragment, which is neither the value nor the placeholder. The
protocol:

1. Append the piece to what is held back.
2. Find the last "<" in it that could still open a placeholder (`<`, capitals and underscores,
   then digits, with no ">" yet) and is short enough to be one (`MAX_PLACEHOLDER`).
3. Everything before that point is complete: restore the placeholders in it (when restoring is
   allowed) and return it.
4. Keep the rest until a later piece completes or breaks it, or `flush()` ends the stream.

So the concatenation of what `feed` and `flush` return equals restoring the whole text at once.
"""

from __future__ import annotations

import re

from pipeline.security.sealing import unmask

MAX_PLACEHOLDER = 48  # "<CREDIT_CARD_123>" is 17; anything longer is ordinary text
_OPENING = re.compile(r"<(?:[A-Z][A-Z_]*\d*)?$")  # a prefix of "<TYPE_N>" with no ">" yet


class StreamUnmasker:
    """Feed it the pieces of one answer in order; it returns what may be sent now."""

    def __init__(self, mapping: dict[str, str] | None, restore: bool = True) -> None:
        self._mapping = mapping or {}
        self._restore = restore
        self._held = ""

    def _out(self, text: str) -> str:
        return unmask(text, self._mapping) if self._restore and self._mapping else text

    def feed(self, piece: str) -> str:
        text = self._held + piece
        cut = text.rfind("<")
        if cut >= 0 and len(text) - cut < MAX_PLACEHOLDER and _OPENING.fullmatch(text[cut:]):
            self._held = text[cut:]
            text = text[:cut]
        else:
            self._held = ""
        return self._out(text)

    def flush(self) -> str:
        """The end of the stream: what is held is sent as it is (restored if it is whole)."""
        text, self._held = self._held, ""
        return self._out(text)
