"""Media: SSRF-safe fetch (`fetch`, `guard`) and bomb-safe decode (`decode`) of a request's images."""
