"""hpctrain: site profiles -> rendered sbatch -> torchrun -> signal -> checkpoint -> resume."""

__version__ = "0.1.0"
