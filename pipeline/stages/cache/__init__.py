"""Cache lookup: reuse an answer only when meaning and boundaries match (`gate`, `semantic`,
`verifier`, `lexicon`, `order`); pipeline/evaluation/ (`cache`, `cache_fit`) measures and fits it offline."""
