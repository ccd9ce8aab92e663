"""`radixflow bench`: serving workloads, a load-generating client, baselines, reports and plots."""
