"""Settings, parsed and validated only: `settings` (the stack's settings from YAML and LLMPIPE_ environment
variables), `tenants`, `feedback`, `lora` (their policy models). Imports nothing but contracts."""
