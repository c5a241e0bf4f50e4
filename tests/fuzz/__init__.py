"""Grammar-aware fuzzing of the wire contracts (data-plane frames, control-plane payloads).

`tests.fuzz.strategies` builds the inputs, `tests.fuzz.targets` runs them through the code under
test and checks the properties; the ``test_fuzz_*`` modules run every target a few hundred times
(``CONCORD_FUZZ_EXAMPLES``), ``bench/fuzz.py`` thousands of times.
"""
