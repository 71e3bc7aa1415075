"""Ray actors: ProgressController, Executor and Sink, as plain classes Ray can host."""
