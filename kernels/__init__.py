"""The kernels of the hot loops, each a numba CPU kernel for numpy arrays beside a plain
reference written once against `xp` (numpy or cupy) that the tests compare it with.

Layer kernels, allocation-free (they write into the model's workspace): `activations` (bias +
activation, its derivative, dropout), `loss` (softmax cross-entropy), `batchnorm`, `im2col`
and `conv_rows` (convolutions), `pool` (max and average pooling), `updaters` (each updater's
fused step) and `rows` (the batch gather). `dispatch.numpy_or_reference` is the one switch
between a kernel's numba path and its reference.

`threshold` is the other family: the threshold codec of `sharing` mode, with numba-CUDA kernels
beside the CPU ones and its own message format.
"""
