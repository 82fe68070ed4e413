"""The assembly point: which workers run in which process, for every way of starting the stack.

`stack` (in-process `llmpipe up` and the detached stack), `children` (`up --processes`: one
`llmpipe worker` child per stage group, restarted with backoff), `launch` (the workers of one group:
stage workers, the warehouse sink, the feedback worker), `dev_key` (the development tenant's key).
"""
