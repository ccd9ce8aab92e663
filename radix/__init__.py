"""radixflow.radix"""
