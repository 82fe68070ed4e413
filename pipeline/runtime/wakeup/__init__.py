"""Waking consumers of a broker that never wakes a waiting fetch: `doorbell` (a producer rings the
consumers of the topics it wrote), `bellpoll` (polling with fetches that do not wait), `polling` (one
bounded, backing-off poll)."""
