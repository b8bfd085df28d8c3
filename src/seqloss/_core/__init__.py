"""Shared machinery: errors, checks, dispatch, reductions, op helpers, the family registry."""
