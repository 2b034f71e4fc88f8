"""Run folders: what a run writes and reads back (checkpoints, the training log, metrics,
renders, the curve, flythroughs) and the dataset a config names."""
