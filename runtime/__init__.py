"""What every process of a run shares: the run directory, logging, process lifecycle."""
