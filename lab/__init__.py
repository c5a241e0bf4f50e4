"""The experiment harness: the ``concord`` command line, sweeps, presets, reports and plots."""
