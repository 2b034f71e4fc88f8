"""The training loop and its entry points: the trainer, starting, resuming, evaluating and
rendering a run, the ranks of a job, the progress line, Ctrl-C, TensorBoard and torch's
threads during the steps."""
