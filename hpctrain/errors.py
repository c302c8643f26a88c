"""Compatibility alias: the errors live in hpctrain.kernel.errors (no click). Import from there."""

from hpctrain.kernel.errors import HpctrainError, Problem, UserError, ValidationError

__all__ = ["HpctrainError", "Problem", "UserError", "ValidationError"]
