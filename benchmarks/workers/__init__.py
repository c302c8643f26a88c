"""hpctrain-side worker scripts the benchmarks launch with torchrun."""
