"""What a person sees of a run: the console's bar and phases, the run's log, its metrics."""
