"""What a worker process serves over HTTP: `asgi` (uvicorn inside a process that owns its signals),
`metrics` (Prometheus metrics, fixed label vocabularies only)."""
