"""The stage-worker runtime: consume -> bounded queue -> process -> produce -> commit.

Here, the worker core: `worker` (the consume loop), `handler` (what a worker drives), `stage` (the
Stage API), `stage_handler` (the record protocol of a request stage), `outputs`, `offsets`, `flow`
(backpressure), `codec`, `errors`, `dlq`, `topics` (the topic registry), `topology`, `service` (the
lifecycle every long-lived part follows), `stack_events`. Sub-packages by concern: `broker/`
(embedded-broker supervision), `wakeup/`, `follow/` (topic followers), `serve/` (HTTP and metrics).
"""
