"""Benchmarks of rlkube against its peers: ``rlkube bench NAME`` (see benchmarks/cli.py)."""
