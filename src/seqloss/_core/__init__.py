"""Shared machinery: errors, argument checks, dispatch, reductions, op helpers, the family registry."""
