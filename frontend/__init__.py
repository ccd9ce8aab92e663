"""radixflow.frontend"""
