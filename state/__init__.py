"""Shared-memory state: tables, distinct sets, init state and the kernels over them."""
