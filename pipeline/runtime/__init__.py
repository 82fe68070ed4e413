"""The stage-worker runtime: consume -> bounded queue -> process -> produce -> commit."""
