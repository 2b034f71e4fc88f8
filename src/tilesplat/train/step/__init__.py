"""The training step and its GPU machinery: the batch, the loss, render + backward + Adam as
one function, the queued and checked step, the intersection capacity, the CUDA graph, the
device."""
