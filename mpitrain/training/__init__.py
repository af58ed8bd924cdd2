"""A run from set-up to summary: the parts built once (`run`), the training loop in named steps
(`loop`), greedy RBM pretraining (`pretrain`), distributed evaluation and prediction
(`evaluation`), metrics windows (`metrics`), and what keeps a job safe: the watchdog
(`watchdog`), stop signals and requeueing (`preemption`), the allocation trace (`allocations`)."""
