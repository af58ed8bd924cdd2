"""Kernels for the hot custom parts (threshold encoding, im2col), each with a numpy reference."""
