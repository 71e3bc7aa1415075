"""Runs over several nodes of a Ray cluster: the state partitioned by key, a team per node."""
