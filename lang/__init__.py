"""radixflow.lang"""
