"""What the control topic teaches every worker: `tenants` (keys, ACLs, limits), `adapters` (LoRA
registrations), `actor` (the active actor revision), `metering` (usage per tenant)."""
