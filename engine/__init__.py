"""Behind a `Session`: the plan, the engine that assembles and runs a team, the watermark,
checkpoints and recovery, and the outbox of pushed tables."""
