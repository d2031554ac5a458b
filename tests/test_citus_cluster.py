"""scripts/citus_cluster.py without a cluster: where Citus is missing it says so in one
line and exits non-zero (make test-citus relies on it), and each node gets a folder of
its own under var/citus. Plain pytest, no database."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "citus_cluster.py"


def load():
    spec = importlib.util.spec_from_file_location("citus_cluster_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_without_citus_so_it_says_so_in_one_line_and_fails(monkeypatch, tmp_path, capsys):
    cluster = load()
    monkeypatch.setattr(cluster, "citus_libdir", lambda bindir: str(tmp_path))  # no citus.so there
    assert cluster.main(["available"]) == 2
    assert cluster.main(["start"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all("Citus is not installed" in line and "vendor" in line for line in lines)


def test_each_node_has_its_own_folder():
    cluster = load()
    bases = [layout.link for layout in cluster.layouts("/project")]
    assert bases == [
        "/project/var/citus/coordinator",
        "/project/var/citus/worker1",
        "/project/var/citus/worker2",
    ]
    # embedded_pg relocates a cluster root cannot reach to a folder named after a hash
    # of `root`: distinct roots, distinct folders.
    assert len({cluster.ep.fallback_dir(layout) for layout in cluster.layouts("/project")}) == 3


def test_a_cluster_of_its_own_lists_the_workers_added_to_it(tmp_path):
    # make chaos-citus's private cluster under --base, after add-worker made worker3:
    # stop and destroy must reach it too, workers in their order, coordinator first.
    cluster = load()
    for name in ("coordinator", "worker1", "worker2", "worker3", "worker10"):
        (tmp_path / name).mkdir()
    names = [Path(layout.link).name for layout in cluster.layouts("/project", str(tmp_path))]
    assert names == ["coordinator", "worker1", "worker2", "worker3", "worker10"]
