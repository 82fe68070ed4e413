"""Mask: authentication (`auth`), then PII masking (`pii`, `recognizers`, `names`, `names_ko`,
`addresses`, `ids`) that fails closed (`failclosed`, `limits`); `eval` measures recall offline."""
