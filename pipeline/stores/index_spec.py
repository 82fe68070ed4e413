"""Which vector index a spec names, and opening it: `edge:/dir` (Qdrant Edge, embedded), `qdrant:url`
(a Qdrant server), `qdrant-local:/dir` and `qdrant-memory:` (qdrant-client's local modes). The
implementations import the interface (vector_index.py); this module imports them, so neither
needs a function-local import."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline.stores.qdrant_client_index import QdrantClientIndex
from pipeline.stores.qdrant_edge_index import EdgeIndex
from pipeline.stores.vector_index import VectorIndex

SPEC_HELP = ("expected edge:/dir, qdrant:http(s)://host:port, qdrant-local:/dir or qdrant-memory: "
             "(relative dirs resolve against the current directory)")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'edge:/d' -> ('edge', '/d'); 'qdrant:http://h:6333' -> ('qdrant', url);
    'qdrant-local:/d' -> ('qdrant-local', '/d'); 'qdrant-memory:' -> ('qdrant-memory', None)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"bad vector index spec {spec!r}: {SPEC_HELP}")
    scheme, _, rest = spec.partition(":")
    rest = rest.strip()
    if scheme in ("edge", "qdrant-local"):
        if not rest:
            raise ValueError(f"bad vector index spec {spec!r}: {scheme}: needs a directory; {SPEC_HELP}")
        return scheme, str(Path(rest).expanduser().resolve())
    if scheme == "qdrant":
        if not (rest.startswith(("http://", "https://")) and len(rest.split("://", 1)[1]) > 0):
            raise ValueError(f"bad vector index spec {spec!r}: qdrant: needs an http(s):// URL; {SPEC_HELP}")
        return scheme, rest
    if scheme == "qdrant-memory":
        if rest:
            raise ValueError(f"bad vector index spec {spec!r}: qdrant-memory: takes nothing after the colon")
        return scheme, None
    raise ValueError(f"bad vector index spec {spec!r}: unknown kind {scheme!r}; {SPEC_HELP}")


def open_index(spec: str, dim: int, keyword_fields: Sequence[str] = (),
               numeric_fields: Sequence[str] = (), api_key: str | None = None) -> VectorIndex:
    """`api_key`: a Qdrant server's key (qdrant: specs only)."""
    kind, arg = parse_spec(spec)
    if kind == "edge":
        return EdgeIndex(Path(arg), dim, keyword_fields=keyword_fields, numeric_fields=numeric_fields)
    if kind == "qdrant":
        return QdrantClientIndex(dim, url=arg, keyword_fields=keyword_fields, numeric_fields=numeric_fields,
                                 api_key=api_key)
    if kind == "qdrant-local":
        return QdrantClientIndex(dim, path=arg, keyword_fields=keyword_fields, numeric_fields=numeric_fields)
    return QdrantClientIndex(dim, location=":memory:", keyword_fields=keyword_fields,
                             numeric_fields=numeric_fields)
