"""`run -o json`: one JSON object per line and event on stdout, job text kept as data."""

import json
import sys

TRICKY = 'loss "nan" <b>[bold]x[/bold]</b> \\\\ tab\there'
JOB = (f"import os, sys\nprint({TRICKY!r}, flush=True)\n"
       "if os.environ['TRAINWARDEN_RESTART_ROUND'] == '0' and os.environ['RANK'] == '1':\n"
       "    print('killed', file=sys.stderr)\n"
       "    sys.exit(137)\n")


def test_run_emits_every_event_as_a_json_line(cli, job_id, store):
    # OnFailure: any failure restarts, whatever the catalogue makes of it.
    args = "--enable-job-restart=True --fault-tolerant-policy=OnFailure"
    result = cli("run", "-o", "json", "--job-id", job_id, "--nproc", "2", "--args", args,
                 "--", sys.executable, "-c", JOB)
    assert result.code == 0, result
    events = [json.loads(line) for line in result.out.splitlines()]  # nothing else on stdout
    assert all(isinstance(e["time"], float) and e.get("job_id", job_id) == job_id for e in events)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "job_started" and kinds[-1] == "job_finished"
    assert [e["round"] for e in events if e["event"] == "round"] == [0, 1]
    started = [(e["instance"], e["round"]) for e in events if e["event"] == "instance_started"]
    assert sorted(started) == [("worker-0", 0), ("worker-0", 1), ("worker-1", 0), ("worker-1", 1)]
    exits = {(e["instance"], e["round"]): e["exit_code"] for e in events if e["event"] == "instance_exited"}
    assert exits[("worker-1", 0)] == 137 and exits[("worker-1", 1)] == 0
    decisions = [e for e in events if e["event"] == "decision"]
    restart = next(d for d in decisions if d["kind"] == "restart_job")
    assert restart["instance"] == "worker-1" and restart["error_code"] == 137 and restart["error_message"] == "killed"
    assert restart["rule"] and restart["reason"] and restart["action_id"]
    assert decisions[-1]["kind"] == "complete_job"
    lines = [e for e in events if e["event"] == "line" and e["stream"] == "stdout"]
    assert {e["text"] for e in lines} == {TRICKY}
    # worker-0's first round may be stopped by the restart before its interpreter got to print.
    assert {(e["instance"], e["round"]) for e in lines} >= {("worker-1", 0), ("worker-0", 1), ("worker-1", 1)}
    finished = events[-1]
    assert finished["status"] == "succeeded" and finished["exit_code"] == 0 and finished["restarts"] == 1
    assert "trainwarden ▸" not in result.out


def test_quiet_json_leaves_out_the_lines(cli, job_id):
    result = cli("run", "-o", "json", "--quiet", "--job-id", job_id, "--", sys.executable, "-c", "print('x')")
    assert result.code == 0, result
    kinds = {json.loads(line)["event"] for line in result.out.splitlines()}
    assert "line" not in kinds and {"instance_started", "instance_exited", "job_finished"} <= kinds
