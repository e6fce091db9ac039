"""parse.py on lines captured from the real Slurm 22.05.8 of deploy/slurm/local-slurm."""

from __future__ import annotations

import pytest

from trainwarden.runtime.slurm.parse import (
    JobState,
    NodeState,
    compress_hostlist,
    expand_hostlist,
    parse_exit_code,
    parse_jobs,
    parse_kv,
    parse_node_state,
    parse_nodes,
    parse_steps,
    parse_tasks_per_node,
    torch_env_from_slurm,
)

# `scontrol show node -o n2` after `scontrol update nodename=n2 state=drain reason="Trainwarden isolated: nccl error"`
NODE_DRAINED = (
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.06 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost Port=17002 Version=22.05.8 "
    "OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=19969 Sockets=2 Boards=1 "
    "State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-01T09:27:18 SlurmdStartTime=2026-12-01T12:30:21 LastBusyTime=2026-12-01T12:30:21 "
    "CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=Trainwarden isolated: nccl error [root@2026-12-01T12:30:22]"
)
# n2 ~31 s after `kill -9` of its slurmd (SlurmdTimeout=30)
NODE_DOWN = (
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.17 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost Port=17002 Version=22.05.8 "
    "OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=19675 Sockets=2 Boards=1 "
    "State=DOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-01T09:27:17 SlurmdStartTime=2026-12-01T12:30:21 LastBusyTime=2026-12-01T12:41:30 "
    "CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=Not responding [root@2026-12-01T12:41:30]"
)
# n1 while a 1-core job runs on it
NODE_MIXED = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=1.13 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost Version=22.05.8 "
    "OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=20122 Sockets=2 Boards=1 "
    "State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-01T09:27:17 SlurmdStartTime=2026-12-01T12:28:50 LastBusyTime=2026-12-01T12:28:50 "
    "CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES=cpu=1 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)
# the holder job after slurmctld requeued it for the death of n2 (ExcNodeList from an earlier requeue_now)
JOB_REQUEUED = (
    "JobId=1 JobName=hold UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) "
    "QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-01T12:41:30 "
    "EligibleTime=2026-12-01T12:43:31 AccrueTime=2026-12-01T12:43:31 StartTime=2026-12-01T12:43:31 EndTime=Unknown "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T12:40:54 Scheduler=Main Partition=debug "
    "AllocNode:Sid=localhost:6849 ReqNodeList=(null) ExcNodeList=n3 NodeList= NumNodes=2 NumCPUs=2 NumTasks=2 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=4000M,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=YES "
    "Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/work/main StdErr=/tmp/sx/1-holder.out "
    "StdIn=/dev/null StdOut=/tmp/sx/1-holder.out Power= "
)
JOB_RUNNING = (
    "JobId=1 JobName=hold UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) "
    "QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
    "RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-01T12:28:59 EligibleTime=2026-12-01T12:28:59 "
    "AccrueTime=2026-12-01T12:28:59 StartTime=2026-12-01T12:29:00 EndTime=Unknown Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-12-01T12:29:00 Scheduler=Main Partition=debug AllocNode:Sid=localhost:6849 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* MinCPUsNode=1 "
    "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=YES Contiguous=0 "
    "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp StdErr=/tmp/sx/1-holder.out StdIn=/dev/null "
    "StdOut=/tmp/sx/1-holder.out Power= "
)
# `scontrol show step -o 1` while a 2-task step runs in the holder allocation
STEPS = (
    "StepId=1.batch UserId=0 StartTime=2026-12-01T12:29:00 TimeLimit=UNLIMITED State=RUNNING Partition=debug "
    "NodeList=n1 Nodes=1 CPUs=0 Tasks=1 Name=batch Network=(null) TRES=(null) ResvPorts=(null) CPUFreqReq=Default "
    "SrunHost:Pid=(null):0\n"
    "StepId=1.1 UserId=0 StartTime=2026-12-01T12:29:06 TimeLimit=UNLIMITED State=RUNNING Partition=debug "
    "NodeList=n[1-2] Nodes=2 CPUs=2 Tasks=2 Name=bash Network=(null) TRES=cpu=2,mem=0,node=2 ResvPorts=(null) "
    "CPUFreqReq=Default Dist=Cyclic SrunHost:Pid=vm:8904\n"
)
# The SLURM_* of task 0 of `srun --jobid=1 -N2 -n2 --ntasks-per-node=1` (captured; SLURMD_NODENAME=n1)
STEP_ENV = {
    "SLURM_JOB_ID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURMD_NODENAME": "n1",
}


def test_kv_keeps_spaces_in_values_and_odd_keys():
    rec = parse_kv(NODE_DRAINED)
    assert rec["Reason"] == "Trainwarden isolated: nccl error [root@2026-12-01T12:30:22]"
    assert rec["OS"] == "Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0"
    assert rec["State"] == "IDLE+DRAIN"
    assert rec["AllocTRES"] == ""
    assert rec["CfgTRES"] == "cpu=2,mem=2000M,billing=2"
    job = parse_kv(JOB_RUNNING)
    assert job["NtasksPerN:B:S:C"] == "1:0:*:*"
    assert job["CPUs/Task"] == "1"
    assert job["AllocNode:Sid"] == "localhost:6849"
    assert job["Power"] == ""


def test_reason_holding_key_value_text_stays_whole():
    line = NODE_DRAINED.replace("Trainwarden isolated: nccl error", "Trainwarden isolated: RANK=3 saw Xid=79 on gpu 2")
    node = parse_nodes(line)[0]
    assert node.reason == "Trainwarden isolated: RANK=3 saw Xid=79 on gpu 2"
    assert node.state is NodeState.DRAINED


def test_nodes():
    drained, down, mixed = parse_nodes("\n".join([NODE_DRAINED, NODE_DOWN, NODE_MIXED]))
    assert (drained.name, drained.state, drained.drain, drained.not_responding) == ("n2", NodeState.DRAINED, True, False)
    assert drained.reason == "Trainwarden isolated: nccl error"
    assert drained.addr == "127.0.0.1"
    assert (down.state, down.drain, down.not_responding, down.reason) == (NodeState.DOWN, False, True, "Not responding")
    assert (mixed.state, mixed.drain, mixed.not_responding, mixed.reason) == (NodeState.MIXED, False, False, "")
    assert mixed.usable and not drained.usable and not down.usable


@pytest.mark.parametrize(
    "text, expected",
    [
        # scontrol State=
        ("IDLE", (NodeState.IDLE, False, False)),
        ("IDLE+DRAIN", (NodeState.DRAINED, True, False)),
        ("MIXED+DRAIN", (NodeState.DRAINING, True, False)),
        ("ALLOCATED+DRAIN", (NodeState.DRAINING, True, False)),
        ("MIXED+NOT_RESPONDING", (NodeState.MIXED, False, True)),
        ("DOWN+NOT_RESPONDING", (NodeState.DOWN, False, True)),
        ("DOWN+DRAIN+NOT_RESPONDING", (NodeState.DOWN, True, True)),
        ("IDLE+DRAIN+FAIL", (NodeState.FAIL, True, False)),
        ("COMPLETING", (NodeState.COMPLETING, False, False)),
        ("FUTURE", (NodeState.UNKNOWN, False, False)),
        # sinfo %t and %T, as seen here (mix*, down*) and documented
        ("idle", (NodeState.IDLE, False, False)),
        ("mix", (NodeState.MIXED, False, False)),
        ("mix*", (NodeState.MIXED, False, True)),
        ("mixed*", (NodeState.MIXED, False, True)),
        ("down*", (NodeState.DOWN, False, True)),
        ("idle*", (NodeState.IDLE, False, True)),
        ("drain", (NodeState.DRAINED, True, False)),
        ("drained", (NodeState.DRAINED, True, False)),
        ("drng", (NodeState.DRAINING, True, False)),
        ("drain*", (NodeState.DRAINED, True, True)),
        ("alloc", (NodeState.ALLOCATED, False, False)),
        ("idle~", (NodeState.IDLE, False, False)),
        ("", (NodeState.UNKNOWN, False, False)),
    ],
)
def test_node_states(text, expected):
    assert parse_node_state(text) == expected


def test_jobs():
    running, requeued = parse_jobs(JOB_RUNNING + "\n" + JOB_REQUEUED)
    assert running.job_id == 1 and running.name == "hold"
    assert running.state is JobState.RUNNING
    assert running.nodes == ("n1", "n2") and running.batch_host == "n1"
    assert running.excluded == () and running.restarts == 0 and running.reason == ""
    assert running.exit_code is None
    assert requeued.state is JobState.PENDING and requeued.reason == "BeginTime"
    assert requeued.nodes == () and requeued.excluded == ("n3",) and requeued.restarts == 2


def test_job_exit_codes():
    cancelled = parse_jobs(JOB_RUNNING.replace("JobState=RUNNING", "JobState=CANCELLED").replace("ExitCode=0:0", "ExitCode=0:15"))[0]
    assert cancelled.state is JobState.CANCELLED and cancelled.exit_code == -15
    failed = parse_jobs(JOB_RUNNING.replace("JobState=RUNNING", "JobState=FAILED").replace("ExitCode=0:0", "ExitCode=3:0"))[0]
    assert failed.exit_code == 3 and failed.state.finished
    assert parse_exit_code("garbage") is None


def test_job_states():
    for state in JobState:
        assert parse_jobs(JOB_RUNNING.replace("JobState=RUNNING", f"JobState={state.value}"))[0].state is state
    assert parse_jobs(JOB_RUNNING.replace("JobState=RUNNING", "JobState=WHATEVER"))[0].state is JobState.UNKNOWN


def test_steps():
    batch, step = parse_steps(STEPS)
    assert (batch.job_id, batch.step_id, batch.state, batch.nodes, batch.special) == (1, "batch", JobState.RUNNING, ("n1",), True)
    assert (step.job_id, step.step_id, step.nodes, step.special) == (1, 1, ("n1", "n2"), False)


@pytest.mark.parametrize(
    "text, names",
    [
        ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
        ("n1,n[3-4]", ("n1", "n3", "n4")),
        ("gpu-[01-03]", ("gpu-01", "gpu-02", "gpu-03")),
        ("gpu-[08-11]", ("gpu-08", "gpu-09", "gpu-10", "gpu-11")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("n2", ("n2",)),
        ("", ()),
        ("(null)", ()),
    ],
)
def test_hostlists(text, names):
    assert expand_hostlist(text) == names


def test_hostlist_errors_and_compress():
    for bad in ("n[1-", "n[3-1]", "n[a]"):
        with pytest.raises(ValueError):
            expand_hostlist(bad)
    assert compress_hostlist(["n1", "n2", "n3", "n5"]) == "n[1-3,5]"
    assert compress_hostlist(["gpu-01", "gpu-02"]) == "gpu-[01-02]"
    assert compress_hostlist(["n2"]) == "n2"
    assert expand_hostlist(compress_hostlist(["a3", "a1", "b7", "login"])) == ("login", "a1", "a3", "b7")


def test_tasks_per_node():
    assert parse_tasks_per_node("1(x2)") == (1, 1)
    assert parse_tasks_per_node("2(x3),1") == (2, 2, 2, 1)
    assert parse_tasks_per_node("4") == (4,)
    with pytest.raises(ValueError):
        parse_tasks_per_node("2(3)")


def test_torch_env_of_a_captured_step():
    env = torch_env_from_slurm(STEP_ENV, "127.0.0.1", 29500)
    assert env == {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": "0",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert torch_env_from_slurm(STEP_ENV, None, 1)["MASTER_ADDR"] == "n1"


def test_torch_env_uneven_tasks_per_node():
    env = dict(STEP_ENV, SLURM_PROCID="6", SLURM_NODEID="3", SLURM_LOCALID="0", SLURM_STEP_NUM_TASKS="7",
               SLURM_STEP_TASKS_PER_NODE="2(x3),1", SLURM_STEP_NODELIST="gpu-[01-04]")
    out = torch_env_from_slurm(env, None, 29400)
    assert (out["RANK"], out["WORLD_SIZE"], out["LOCAL_WORLD_SIZE"], out["NODE_RANK"]) == ("6", "7", "1", "3")
    assert out["MASTER_ADDR"] == "gpu-01"
    # no step variables (a batch script): the job's
    job_env = {k: v for k, v in env.items() if not k.startswith("SLURM_STEP_")}
    job_env["SLURM_TASKS_PER_NODE"] = "2(x3),1"
    job_env["SLURM_NTASKS"] = "7"
    assert torch_env_from_slurm(job_env, "h", 1)["WORLD_SIZE"] == "7"
    with pytest.raises(ValueError):
        torch_env_from_slurm({"SLURM_PROCID": "0"}, "h", 1)
