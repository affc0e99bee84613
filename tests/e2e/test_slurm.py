"""examples/slurm/ under a real SLURM: the test brings up a single-node cluster from Debian's
packages on localhost (munged, slurmctld, slurmd, all under the test's temporary directory, on free
ports), submits each model's sbatch script as written (`sbatch --wait`, the tiny config, 2 ranks
on the one node, no GPUs), and checks that srun's torchrun agent trained it to the end."""
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port, mmtrain_bin, read_metrics, run_mmtrain

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if missing:
        pytest.skip(f"no SLURM here ({', '.join(missing)} missing; scripts/setup.sh installs slurmctld, slurmd, "
                    f"slurm-client and munge)")
    d = tmp_path_factory.mktemp("slurm")
    os.chmod(d, 0o700)  # munged refuses a key in a directory others may write
    (d / "state").mkdir()
    (d / "spool").mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = d / "munge.sock"
    daemon = lambda name: shutil.which(name) or f"/usr/sbin/{name}"  # noqa: E731
    subprocess.run([daemon("munged"), f"--key-file={key}", f"--socket={sock}", f"--pid-file={d / 'munged.pid'}",
                    f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munge.seed'}", "--force"], check=True)
    host, user = socket.gethostname().split(".")[0], getpass.getuser()
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=mmtrain-test
SlurmctldHost={host}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = [subprocess.Popen([daemon("slurmctld"), "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, start_new_session=True),
             subprocess.Popen([daemon("slurmd"), "-D", "-f", str(conf), "-N", host], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)]
    try:
        deadline = time.time() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                logs = "".join((d / f).read_text()[-2000:] for f in ("slurmctld.log", "slurmd.log") if (d / f).exists())
                pytest.skip(f"the local SLURM did not come up (running as {user}):\n{logs}")
            time.sleep(0.5)
        yield env
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=30)
        pid = (d / "munged.pid").read_text().strip() if (d / "munged.pid").exists() else ""
        if pid:
            os.kill(int(pid), signal.SIGTERM)


def sbatch(env, script, out_dir: Path, config, *sets):
    out_dir.mkdir(parents=True)
    proc = subprocess.run(["sbatch", "--wait", "--nodes", "1", "--gpus-per-node=0", f"--output={out_dir / 'job.out'}",
                           str(REPO / "examples" / "slurm" / script), *sets],
                          env=dict(env, CONFIG=str(config), GPUS_PER_NODE="2", OMP_NUM_THREADS="1",
                                   MMTRAIN_BIN=str(mmtrain_bin())),
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    job = (out_dir / "job.out").read_text() if (out_dir / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + job[-3000:]
    return job


def test_magihuman_sbatch_trains_under_slurm(cluster, tmp_path):
    data, base = tmp_path / "data", tmp_path / "base"
    run_mmtrain(["fixture", "magihuman", "--out", str(data), "--samples", "8", "--seed", "1", "--video-grid", "2,2,3",
                 "--audio-tokens", "5", "--text-tokens", "4", "--video-channels", "16", "--audio-channels", "8",
                 "--text-channels", "24"])
    config = REPO / "examples" / "magihuman" / "magihuman_tiny.yaml"
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(config), "--out", str(base)])
    job = sbatch(cluster, "train_magihuman.sbatch", tmp_path / "job", config,
                 "--set", f"model.model_name_or_path={base}", "--set", f"data.dataset_param.data_root={data}",
                 "--set", "training.train_iters=3", "--set", f"logging.output_dir={tmp_path / 'run'}",
                 "--set", f"training.save={tmp_path / 'ckpt'}")
    assert f"mmtrain: 1 node(s) x 2 rank(s), rendezvous on {socket.gethostname().split('.')[0]}:29500" in job
    assert [m["iteration"] for m in read_metrics(tmp_path / "run")] == [1, 2, 3]
    assert (tmp_path / "ckpt" / "latest").read_text() == "iter_0000003\n"


def test_magistral_sbatch_trains_under_slurm(cluster, tmp_path):
    data = tmp_path / "data"
    run_mmtrain(["fixture", "mistral3", "--out", str(data), "--samples", "16", "--seed", "1"])
    config = REPO / "examples" / "magistral" / "magistral_tiny.yaml"
    sbatch(cluster, "train_magistral.sbatch", tmp_path / "job", config,
           "--set", f"data.dataset_param.preprocess_parameters.model_name_or_path={data / 'tekken.json'}",
           "--set", f"data.dataset_param.basic_parameters.dataset={data / 'conversations.json'}",
           "--set", "training.train_iters=3", "--set", f"logging.output_dir={tmp_path / 'run'}",
           "--set", f"training.save={tmp_path / 'ckpt'}")
    assert [m["iteration"] for m in read_metrics(tmp_path / "run")] == [1, 2, 3]
