"""Benchmarks of hvdtorch against its peers; benchmarks.workloads holds the
models and data they (and the examples) train on."""
