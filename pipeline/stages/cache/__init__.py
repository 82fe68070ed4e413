"""Cache lookup: reuse an answer only when meaning and boundaries match (`gate`, `semantic`,
`verifier`, `lexicon`, `order`); `eval` and `calibration` fit and measure it offline."""
