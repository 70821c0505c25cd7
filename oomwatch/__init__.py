"""oomwatch: node-level cgroup v2 and OOM-kill diagnostics."""

__version__ = "0.1.0"
