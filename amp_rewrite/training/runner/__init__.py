"""Running the step: the trainer's loop, its batches and schedule, checkpoints, evaluation and the
export (the session and its bindings are ``runtime.step_session``'s)."""
