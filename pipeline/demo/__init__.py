"""`llmpipe demo` (`make demo`): `run` sends the bundled traffic through a fresh embedded stack and
prints the report; `images` serves the demo's local images."""
