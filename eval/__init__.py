"""Benchmarks: LAMA, LAMA-UHN and PopQA readers, P@k metrics, the evaluation harness and its report."""
