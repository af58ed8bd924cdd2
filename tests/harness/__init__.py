"""The harness tests and benchmarks share, installed as `mpitrain.testing` (from tests/harness/):
starting mpitrain as users do (`launch`), small datasets and configs (`datasets`), a simulated
cluster of network namespaces (`cluster`), a one-node Slurm started as plain processes (`slurm`),
the thread-pool probe (`thread_pools`), kernel test cases (`threshold_cases`, `updater_cases`,
`cuda_check`), the README's benchmark tables (`tables`) and the scaling benchmark's rows through the
cost model (`scaling_model`)."""
