"""Mask: authentication (`auth`), then PII masking (`pii`, `recognizers`, `names`, `names_ko`,
`addresses`, `ids`) that fails closed (`failclosed`, `limits`); pipeline/evaluation/mask.py measures recall
offline."""
