"""Reading EXPLAIN (FORMAT JSON) plans in tests."""

from __future__ import annotations

from collections.abc import Iterator


def job_runs_reads(node: dict) -> Iterator[dict]:
    """The nodes of a plan that read a partition of job_runs (not the write itself)."""
    if node["Node Type"] != "ModifyTable" and node.get("Relation Name", "").startswith("job_runs"):
        yield node
    for child in node.get("Plans", []):
        yield from job_runs_reads(child)
