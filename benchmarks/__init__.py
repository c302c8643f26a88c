"""hpctrain benchmarks: see benchmarks/run.py."""
