"""Admit, the AI gateway: budgets, RPM/TPM/concurrency exact across replicas, queue-or-reject with
deadlines (`stage`, `state`, `policy`), idempotency keys (`idempotency`, `request_ids`)."""
