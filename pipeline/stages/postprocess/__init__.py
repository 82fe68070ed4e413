"""Postprocess: un-mask where allowed, validate against the caller's schema (`schema`), write back
to the cache, the terminal answer."""
