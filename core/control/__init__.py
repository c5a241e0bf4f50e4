"""The consensus-control loop: the consensus distance and its estimator, control policies, phase
plans."""
