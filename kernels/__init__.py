"""radixflow.kernels"""
