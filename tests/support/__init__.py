"""What tests share: paths, condition waits, Kafka and process helpers, the CLI as a user runs it,
and handles on running stacks. Tests import from here, never from another test module (an
import-rule test in tests/test_layout.py holds this)."""
