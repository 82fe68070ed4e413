"""Vision encode: tenant-scoped image features and a short description (`describe`)."""
