"""Offline evaluation and fitting, outside the runtime stages: `cache` (`llmpipe cache-eval`: labelled
prompt pairs through a fresh semantic cache, hits against labels), `cache_fit` (`llmpipe cache-fit`:
the cache verifier's calibration from labelled pairs; the stage loads the result,
stages/cache/verifier.json), `mask` (`llmpipe mask-eval`: recall and false positives of the masker
on labelled sentences)."""
