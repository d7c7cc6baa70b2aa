"""Specializing compile cache: structural request keys, shortcut compilation
(two sequences compiled, then expanded to N) and an LRU of optimized computations."""

from __future__ import annotations

from .caching_compiler import CachingCompiler, cache_for
from .expand import (
    ExpansionError,
    ExpansionPlan,
    expand_computation,
    rekey_snapshot,
    snapshot_precomputed,
)
from .key import (
    Layout,
    RequestKey,
    ShiftPolicy,
    mini_request,
    regular_layout,
    request_key,
    request_layouts,
    shift_policy,
)

__all__ = ["CachingCompiler", "ExpansionError", "ExpansionPlan", "Layout", "RequestKey",
           "ShiftPolicy", "cache_for", "expand_computation", "mini_request", "regular_layout",
           "rekey_snapshot", "request_key", "request_layouts", "shift_policy",
           "snapshot_precomputed"]
