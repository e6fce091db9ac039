"""Stack snapshots of a hung job, taken before its restart, with each tool."""

import json
import sys
from pathlib import Path

import pytest

from trainwarden.diagnose.collect import find_tool

pytestmark = pytest.mark.e2e
STUCK = str(Path(__file__).parent / "programs" / "stuck.py")
HANG = "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=2"


@pytest.mark.parametrize("tool", ["py-spy", "pystack"])
def test_a_hung_job_is_dumped_grouped_and_the_odd_instance_named_before_the_restart(cli, job_id, tool):
    if find_tool(tool) is None:
        pytest.skip(f"{tool} is not installed here")
    result = cli("run", "--job-id", job_id, "--nproc", "4", "--args", HANG, "--stack-tools", tool,
                 "--stop-grace", "1", "--", sys.executable, STUCK)
    assert result.code == 0, result
    assert "stack report: suspect worker-3" in result.err
    [report] = json.loads(cli("stacks", "--job", job_id, "--json").out)
    assert report["suspects"] == "worker-3" and report["tool"] == tool and report["processes"] == 4
    groups = report["report"]["groups"]
    main_groups = sorted((g["count"], g["frames"][0]["function"]) for g in groups if g["main"])
    assert main_groups == [(1, "load_corrupt_shard"), (3, "wait_for_allreduce")]
    loaders = [g for g in groups if g["frames"] and g["frames"][0]["function"] == "prefetch_batches"]
    assert loaders and loaders[0]["count"] == 4  # the data-loader threads of every instance
    assert report["report"]["missing"] == []


def test_a_stuck_dump_and_a_missing_tool_delay_the_restart_by_the_timeout_at_most(cli, job_id, tmp_path):
    stuck_tool = tmp_path / "pystack"
    stuck_tool.write_text("#!/bin/sh\nsleep 60\n")
    stuck_tool.chmod(0o755)
    result = cli("run", "--job-id", job_id, "--nproc", "2", "--args", HANG, "--stack-tools", "py-spy,pystack",
                 "--stack-timeout", "2", "--stop-grace", "1", "--", sys.executable, STUCK,
                 env={"TRAINWARDEN_PYSPY": str(tmp_path / "no-such-py-spy"), "TRAINWARDEN_PYSTACK": str(stuck_tool)})
    assert result.code == 0, result
    [report] = json.loads(cli("stacks", "--job", job_id, "--json").out)
    assert report["processes"] == 0 and report["verdict"] == "no instance could be dumped"
    missing = report["report"]["missing"]
    assert len(missing) == 2 and all("py-spy is not installed" in m and "pystack took longer than 2 s" in m
                                     for m in missing)
    [restart] = [r for r in json.loads(cli("history", "--job", job_id, "--json").out) if r["result"] == "done"]
    # Detected, dumped in parallel (2 s), restarted: the dump cost at most its timeout.
    assert restart["duration_s"] < 2 + 3, restart


def test_stacks_analyze_groups_saved_dumps_of_several_tools(cli, tmp_path):
    pyspy = ('Process 101: python train.py\nPython v3.11\n\nThread 101 (idle): "MainThread"\n'
             "    wait (dist.py:10)\n    step (train.py:5)\n")
    pystack = ('Traceback for thread 202 (python) [MainThread] (most recent call last):\n'
               '    (Python) File "/x/train.py", line 5, in step\n        wait()\n'
               '    (Python) File "/x/dist.py", line 10, in wait\n        sleep()\n')
    faulthandler = ('Current thread 0x00007f0000000001 (most recent call first):\n'
                    '  File "/x/io.py", line 3 in read_shard\n  File "/x/train.py", line 5 in step\n')
    for name, text in (("rank0.txt", pyspy), ("rank1.txt", pystack), ("rank2.txt", faulthandler)):
        (tmp_path / name).write_text(text)
    result = cli("stacks", "analyze", "--json", *(str(tmp_path / n) for n in ("rank0.txt", "rank1.txt", "rank2.txt")))
    assert result.code == 0, result
    report = json.loads(result.out)
    assert report["suspects"] == ["rank2"]
    assert [g["count"] for g in report["groups"]] == [1, 2]
