"""Mask: authentication (`auth`), then PII masking (`pii`, `recognizers`, `names`, `names_ko`,\n`addresses`, `ids`) that fails closed (`failclosed`, `limits`); `eval` measures recall offline."""
