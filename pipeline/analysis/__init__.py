"""What analysts and operators read from the warehouse and the topics.

`report` and `render` (the analyst report and its text/HTML forms), `capacity` (`llmpipe plan`:
workers needed for a rate), `profiling` (`llmpipe profile`: a torch-profiler trace of the engine),
`replay` (a topic range re-run through a stage's policy, in shadow, with the decisions diffed).
"""
