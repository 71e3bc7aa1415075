"""Where txstream runs: Ray start/attach and actor start-up; Spark through RayDP."""
