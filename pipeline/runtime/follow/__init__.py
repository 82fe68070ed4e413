"""Reading whole topics into local state: `follower` (every partition from the beginning, no group:
the control changelog), `cancels` (requests their callers withdrew), `changelog` (a stage's state restored)."""
