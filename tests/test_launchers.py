"""The launchers users run multi-worker training with: each recipe of docs/distributed.md, parsed and given each
task's environment as its launcher writes it (Slurm, SkyPilot, Kubeflow Trainer v2 and the TFJob, Vertex AI, Ray),
the variables' bad values as one line each, and a two-process loopback run from SkyPilot's and Trainer v2's
variables alone.

    python -m pytest tests/test_launchers.py                # the recipes and the bad values
    python -m pytest tests/test_launchers.py -m slow        # the loopback runs
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (
    ROOT,
    SUBPROCESS_ENV,
    compose,
    consecutive_free_ports,
    free_ports,
    run_cli,
    tiny_overrides,
    write_cifar,
)
from trainer.distribute import cluster, hosts
from trainer.errors import ConfigError

DOCS = ROOT / "docs" / "distributed.md"
# Every variable a launcher sets that this trainer reads: each test starts without any of them.
LAUNCHER_VARIABLES = (
    *("TF_CONFIG", "CLUSTER_SPEC", "JOB_COMPLETION_INDEX", "SKYPILOT_NODE_IPS", "SKYPILOT_NODE_RANK"),
    *("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE"),
)


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _set(monkeypatch, variables: dict[str, str]) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def _block(text: str, opening: str) -> str:
    """The first code block of `text` that starts with the fence line `opening` (e.g. "```bash\n#!/bin/bash")."""
    return text.split(opening, 1)[1].split("```", 1)[0]


def _kubernetes_expands(arguments: list[str], env: dict[str, str]) -> list[str]:
    """`$(NAME)` in a container's command replaced by its variable, as the kubelet does (unknown ones stay)."""
    return [re.sub(r"\$\((\w+)\)", lambda found: env.get(found.group(1), found.group(0)), arg) for arg in arguments]


# --- Slurm ------------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_sbatch_script_of_the_docs_gives_each_task_its_role_and_address(monkeypatch):
    """The docs' sbatch script, each task's environment as `srun` writes it for that allocation: the cluster
    `strategy.cluster=slurm` gives TensorFlow has one worker per node on the port base, and rank 0 is the chief."""
    from trainer.distribute import strategies

    script = _block(DOCS.read_text(), "```bash\n#!/bin/bash\n")
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", script, re.MULTILINE))
    nodes, per_node = int(options["nodes"]), int(options["ntasks-per-node"])
    (command,) = [line.split() for line in script.splitlines() if line.startswith("srun ")]
    assert command[1:4] == ["python", "run.py", "strategy=multi_worker"] and "strategy.cluster=slurm" in command
    for rank in range(nodes * per_node):
        slurm = {
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(nodes * per_node),
            "SLURM_STEP_NUM_TASKS": str(nodes * per_node),
            "SLURM_STEP_NODELIST": f"gpu[01-{nodes:02d}]",
            "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        }
        _set(monkeypatch, slurm)
        role = cluster.worker_role("slurm", None, None)
        resolver = strategies._resolver("slurm", None, None)
        workers = [f"gpu{node:02d}:{8888 + task}" for node in range(1, nodes + 1) for task in range(per_node)]
        assert resolver.cluster_spec().as_dict() == {"worker": workers}
        assert (resolver.task_type, resolver.task_id) == ("worker", rank)
        assert role.is_chief is (rank == 0) and role.num_workers == nodes * per_node
        assert cluster.may_be_chief(None) is role.is_chief


@pytest.mark.unit
@pytest.mark.parametrize(
    ("hostlist", "expanded"),
    [
        ("gpu01", ["gpu01"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),  # TensorFlow's parser: ValueError
        ("n[1-2],m5,o[3-4,6,7-9]", ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),  # the first number's zero padding
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),  # the leftmost slowest
        ("[1-2]x", ["1x", "2x"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_slurm_hostlists_expand_as_slurm_expands_them(hostlist, expanded):
    assert hosts.expand_hostlist(hostlist) == expanded


@pytest.mark.unit
def test_a_node_list_with_a_suffix_gives_tensorflow_every_task(monkeypatch):
    """`n[1-2]-ib`, Slurm's name of the InfiniBand interfaces: TensorFlow's SlurmClusterResolver failed on it."""
    from trainer.distribute import strategies

    slurm = {"SLURM_STEP_NODELIST": "n[1-2]-ib", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NUM_TASKS": "3"}
    _set(monkeypatch, {**slurm, "SLURM_PROCID": "1"})
    resolver = strategies._resolver("auto", None, None, slurm_port_base=9000)
    assert resolver.cluster_spec().as_dict() == {"worker": ["n1-ib:9000", "n1-ib:9001", "n2-ib:9000"]}
    assert resolver.task_id == 1 and not cluster.worker_role("auto", None, None).is_chief


@pytest.mark.unit
def test_every_gpu_this_process_sees_is_its_own_under_a_cluster_of_workers(monkeypatch):
    """A resolver other than TF_CONFIG's is asked how many GPUs to mirror over: `strategy.workers` said none
    (the CPU), Slurm's resolver one per task."""
    import tensorflow as tf

    from trainer.distribute import strategies

    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["gpu0", "gpu1"] if kind == "GPU"
                        else real(kind))  # fmt: skip
    resolver = strategies._resolver("workers", ["a:1", "b:1"], 1)
    assert resolver.num_accelerators() == {"GPU": 2}
    _set(monkeypatch, {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NODE_RANK": "0"})
    assert strategies._resolver("skypilot", None, None).num_accelerators() == {"GPU": 2}


# --- SkyPilot ---------------------------------------------------------------------------------------------------


def _sky_task() -> dict:
    import yaml

    return yaml.safe_load(_block(DOCS.read_text(), "```yaml\n# sky_task.yaml\n"))


def _run_command(task: dict) -> list[str]:
    """The `python run.py ...` line of a SkyPilot task's `run:` section, as its words."""
    (line,) = [line for line in task["run"].replace("\\\n", " ").splitlines() if "run.py" in line]
    return line.split()


def _skypilot_environment(num_nodes: int, rank: int, ips: list[str] | None = None) -> dict[str, str]:
    """What SkyPilot sets for the `run:` commands on node `rank` of a task with `num_nodes` nodes."""
    ips = ips or [f"10.128.0.{node + 2}" for node in range(num_nodes)]
    return {"SKYPILOT_NODE_IPS": "\n".join(ips), "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(num_nodes)}


@pytest.mark.unit
def test_the_skypilot_task_of_the_docs_gives_each_node_its_role_and_address(monkeypatch):
    from trainer.distribute import strategies

    task = _sky_task()
    command = _run_command(task)
    assert command[:3] == ["python", "run.py", "strategy=multi_worker"]
    source = dict(word.split("=", 1) for word in command[2:])["strategy.cluster"]
    assert task["num_nodes"] == 2 and source == "skypilot"
    roles = []
    for rank in range(task["num_nodes"]):
        _set(monkeypatch, _skypilot_environment(task["num_nodes"], rank))
        roles.append(cluster.worker_role(source, None, None))
        assert cluster.worker_role("auto", None, None) == roles[-1], "auto finds SkyPilot's variables"
        assert cluster.may_be_chief(None) is roles[-1].is_chief
        resolver = strategies._resolver(source, None, None)
        assert resolver.cluster_spec().as_dict() == {"worker": ["10.128.0.2:8888", "10.128.0.3:8888"]}
        assert (resolver.task_type, resolver.task_id) == ("worker", rank)
    assert [role.is_chief for role in roles] == [True, False] and {role.num_workers for role in roles} == {2}


@pytest.mark.unit
def test_tf_config_comes_before_skypilot_and_skypilot_before_slurm(monkeypatch):
    _set(monkeypatch, {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1"})
    assert cluster.worker_role("auto", None, None).source == "slurm"
    _set(monkeypatch, _skypilot_environment(2, 1))
    assert cluster.worker_role("auto", None, None).source == "skypilot"
    assert cluster.may_be_chief(None) is False
    tf_config = {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert cluster.worker_role("auto", None, None).source == "tf_config"


BAD_VARIABLES = [
    ({"SKYPILOT_NODE_IPS": "", "SKYPILOT_NODE_RANK": "0"},
     "SKYPILOT_NODE_IPS is empty; expected the IP address of every node, one a line"),
    ({"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NODE_RANK": "2"},
     "SKYPILOT_NODE_RANK=2 is outside the 2 node(s) of SKYPILOT_NODE_IPS; expected 0 to 1"),
    ({"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NODE_RANK": "one"},
     "SKYPILOT_NODE_RANK must be an integer (this task's rank among the 2 node(s) of SKYPILOT_NODE_IPS); got 'one'"),
    ({"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2"},
     "SKYPILOT_NODE_RANK is not set beside SKYPILOT_NODE_IPS; expected 0 to 1"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
     "SLURM_STEP_NODELIST='n[1-2' is not a Slurm hostlist (a '[' without its ']')"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[2-1]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
     "SLURM_STEP_NODELIST='n[2-1]' is not a Slurm hostlist (the range 2-1 counts down)"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x3)"},
     "SLURM_STEP_TASKS_PER_NODE='1(x3)' counts 3 node(s), SLURM_STEP_NODELIST='n[1-2]' names 2"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "x2"},
     "SLURM_STEP_TASKS_PER_NODE='x2': 'x2' is not a task count like 2 or 2(x3)"),
    ({"SLURM_PROCID": "4", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
     "SLURM_PROCID=4 is outside the 4 task(s) of the Slurm step; expected 0 to 3"),
    ({"SLURM_PROCID": "first", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1"},
     "SLURM_PROCID must be an integer"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NUM_TASKS": "3"},
     "SLURM_STEP_NUM_TASKS=3 but SLURM_STEP_TASKS_PER_NODE='2' places 2 task(s)"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
     "strategy.cluster=slurm: SLURM_STEP_NODELIST is not set; start the tasks with srun"),
]  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize(("variables", "message"), BAD_VARIABLES)
def test_a_launchers_bad_variable_is_one_line_naming_it(monkeypatch, variables, message):
    _set(monkeypatch, variables)
    with pytest.raises(ConfigError) as error:
        cluster.worker_role("auto", None, None)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.unit
def test_a_source_asked_for_and_not_set_up_says_what_it_reads(monkeypatch):
    with pytest.raises(ConfigError, match=r"^strategy.cluster=skypilot but SKYPILOT_NODE_IPS is not set \(run the"):
        cluster.worker_role("skypilot", None, None)
    with pytest.raises(ConfigError, match=r"^strategy.cluster=slurm but SLURM_PROCID is not set"):
        cluster.worker_role("slurm", None, None)


@pytest.mark.integration
def test_a_bad_skypilot_rank_is_one_line_before_any_folder(tmp_path, monkeypatch):
    _set(monkeypatch, {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NODE_RANK": "-1"})
    result = run_cli(["strategy=multi_worker"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: SKYPILOT_NODE_RANK=-1 is outside the 2 node(s) of SKYPILOT_NODE_IPS; expected 0 to 1"
    ]
    assert not (tmp_path / "outputs").exists()


# --- Kubernetes: Kubeflow Trainer v2, and the Training Operator v1's TFJob ----------------------------------------


def _trainjob() -> tuple[dict, dict]:
    """(ClusterTrainingRuntime, TrainJob) of the docs."""
    import yaml

    documents = list(yaml.safe_load_all(_block(DOCS.read_text(), "```yaml\n# trainjob.yaml\n")))
    kinds = {document["kind"]: document for document in documents}
    assert sorted(kinds) == ["ClusterTrainingRuntime", "TrainJob"]
    return kinds["ClusterTrainingRuntime"], kinds["TrainJob"]


def _strategy_overrides(command: list[str]) -> list[str]:
    return [word for word in command if word.startswith("strategy")]


@pytest.mark.unit
def test_the_trainjob_of_the_docs_gives_each_pod_its_role_from_its_completion_index(monkeypatch):
    """The TrainJob on its plain runtime, each pod's command as the kubelet writes it: `JOB_COMPLETION_INDEX`
    substituted, and `strategy.workers` the pods' JobSet names (TRAINJOB-node-0-INDEX.TRAINJOB), one per node."""
    runtime, job = _trainjob()
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert set(runtime["spec"]["mlPolicy"]) == {"numNodes"}, "a plain runtime: no torch, mpi or other policy"
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    (container,) = replicated["template"]["spec"]["template"]["spec"]["containers"]
    assert replicated["name"] == container["name"] == "node", "Trainer's name for the trainer's Job and container"
    port = container["ports"][0]["containerPort"]

    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    nodes, command = trainer["numNodes"], trainer["command"]
    assert command[:3] == ["python", "run.py", "strategy=multi_worker"]
    roles = []
    for index in range(nodes):
        own = _kubernetes_expands(command, {"JOB_COMPLETION_INDEX": str(index)})
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
        options = compose(_strategy_overrides(own)).strategy  # as Hydra parses the command line
        assert list(options.workers) == [f"{name}-node-0-{pod}.{name}:{port}" for pod in range(nodes)]
        roles.append(cluster.worker_role(options.cluster, list(options.workers), options.task_index))
        task_index = next(word.split("=", 1)[1] for word in own if word.startswith("strategy.task_index="))
        assert cluster.may_be_chief(task_index) is roles[-1].is_chief
    assert [role.is_chief for role in roles] == [True] + [False] * (nodes - 1)
    assert nodes == 2 and {role.num_workers for role in roles} == {nodes}


@pytest.mark.unit
def test_the_tfjob_of_the_docs_gives_each_replica_its_role(monkeypatch):
    """The TFJob of docs/distributed.md, with each replica's TF_CONFIG written as Kubeflow's training operator
    writes it (the cluster of chief and workers; the evaluator beside it), and each replica's own overrides."""
    import yaml

    manifest = yaml.safe_load(_block(DOCS.read_text(), "```yaml\n# tfjob.yaml\n"))
    # The kubeflow-training client's typed model (KubeflowOrgV1TFJobSpec) refuses a spec without it.
    assert manifest["spec"]["runPolicy"]["cleanPodPolicy"] == "None", "the evaluator outlives the chief"
    replicas = manifest["spec"]["tfReplicaSpecs"]
    name = manifest["metadata"]["name"]
    spec = {
        role.lower(): [f"{name}-{role.lower()}-{index}:2222" for index in range(replicas[role]["replicas"])]
        for role in ("Chief", "Worker")
    }
    roles = {}
    for role, replica in replicas.items():
        tf_config = json.dumps({"cluster": spec, "task": {"type": role.lower(), "index": 0}})
        monkeypatch.setenv("TF_CONFIG", tf_config)
        roles[role] = cluster.worker_role("auto", None, None)
        command = replica["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["python", "run.py", "strategy=multi_worker"]
        if role == "Evaluator":
            assert any(argument.startswith("checkpoint=") for argument in command), "the evaluator's run folder"
    assert roles["Chief"].is_chief and roles["Chief"].num_workers == 2
    assert not roles["Worker"].is_chief and roles["Evaluator"].is_evaluator


# --- Vertex AI ------------------------------------------------------------------------------------------------------


def _vertex_environment(pools: list[dict], pool: int, index: int) -> dict[str, str]:
    """TF_CONFIG and CLUSTER_SPEC as Vertex AI writes them for replica `index` of worker pool `pool` (extra keys
    included; the evaluator of pool 3 is in CLUSTER_SPEC but not in TF_CONFIG's cluster)."""
    names = {0: "chief", 1: "worker", 2: "ps", 3: "evaluator"}
    addresses = {
        number: [f"cmle-training-workerpool{number}-1a2b3c-{replica}:2222" for replica in range(spec["replicaCount"])]
        for number, spec in enumerate(pools)
        if spec
    }
    job = {"worker_pool_specs": pools}
    cluster_spec = {
        "cluster": {f"workerpool{number}": found for number, found in addresses.items()},
        "environment": "cloud",
        "task": {"type": f"workerpool{pool}", "index": index},
        "job": json.dumps(job),
    }
    tf_config = {
        "cluster": {names[number]: found for number, found in addresses.items() if number != 3},
        "environment": "cloud",
        "task": {"type": names[pool], "index": index, "trial": ""},
        "job": job,
    }
    return {"CLUSTER_SPEC": json.dumps(cluster_spec), "TF_CONFIG": json.dumps(tf_config)}


@pytest.mark.unit
def test_the_vertex_custom_job_of_the_docs_gives_each_replica_its_role(monkeypatch):
    """The CustomJob of docs/distributed.md, each replica's environment as Vertex AI writes it: TF_CONFIG and
    CLUSTER_SPEC give the same roles, and CLUSTER_SPEC alone is read as the TF_CONFIG it describes."""
    import yaml

    pools = yaml.safe_load(_block(DOCS.read_text(), "# vertex_job.yaml\n"))["workerPoolSpecs"]
    roles = {}
    for pool, spec in enumerate(pools):
        if not spec:
            continue
        assert spec["containerSpec"]["command"] == ["python", "run.py"]
        assert spec["containerSpec"]["args"][0] == "strategy=multi_worker"
        environment = _vertex_environment(pools, pool, 0)
        for variables in (environment, {"CLUSTER_SPEC": environment["CLUSTER_SPEC"]}):
            monkeypatch.delenv("TF_CONFIG", raising=False)
            monkeypatch.delenv("CLUSTER_SPEC", raising=False)
            _set(monkeypatch, variables)
            role = cluster.worker_role("auto", None, None)
            assert roles.setdefault(pool, role) == role, "CLUSTER_SPEC alone must give TF_CONFIG's role"
            assert cluster.may_be_chief(None) is role.is_chief
    assert roles[0].is_chief and roles[0].num_workers == 2
    assert not roles[1].is_chief and roles[1].task_type == "worker" and roles[3].is_evaluator
    assert any(argument.startswith("checkpoint=") for argument in pools[3]["containerSpec"]["args"])


# --- Ray ------------------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_ray_call_of_the_docs_runs_run_py_on_workers_whose_first_is_the_chief(monkeypatch):
    """The docs' Ray `TensorflowTrainer` call: each of its `num_workers` gets the worker-only TF_CONFIG Ray's
    TensorflowConfig writes (under Ray Train V1 and V2 alike), and runs `python run.py strategy=multi_worker`;
    worker 0 is the chief. It imports only the names Ray Train V2 keeps, from the modules V2 switches."""
    import ast

    code = _block(DOCS.read_text(), "```python\nimport subprocess\n")
    tree = ast.parse("import subprocess\n" + code)
    imported = {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}  # fmt: skip
    assert imported == {("ray.train.tensorflow", "TensorflowTrainer"), ("ray.train", "ScalingConfig")}
    calls = {node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id: node
             for node in ast.walk(tree) if isinstance(node, ast.Call)}  # fmt: skip
    command = ast.literal_eval(calls["run"].args[0])
    assert command[:3] == ["python", "run.py", "strategy=multi_worker"]
    (workers,) = [ast.literal_eval(keyword.value) for keyword in calls["ScalingConfig"].keywords]
    assert [keyword.arg for keyword in calls["TensorflowTrainer"].keywords] == ["scaling_config"]
    addresses = [f"10.0.0.{index + 1}:{20000 + index}" for index in range(workers)]
    roles = []
    for index in range(workers):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
        roles.append(cluster.worker_role("auto", None, None))
    assert [role.is_chief for role in roles] == [True] + [False] * (workers - 1)
    assert workers == 2 and all(role.num_workers == workers for role in roles)


# --- Two processes on 127.0.0.1, from each launcher's variables alone ------------------------------------------------


def _launch(tmp_path: Path, launcher: str) -> list[tuple[list[str], dict[str, str]]]:
    """Each of two tasks' (overrides, variables) from the docs' recipe for `launcher`, on 127.0.0.1."""
    if launcher == "skypilot":  # two nodes on one machine: the tasks of one host count up from the port base
        base = consecutive_free_ports(2)
        command = _strategy_overrides(_run_command(_sky_task()))
        return [
            ([*command, f"strategy.slurm_port_base={base}"], _skypilot_environment(2, rank, ["127.0.0.1"] * 2))
            for rank in range(2)
        ]
    _, job = _trainjob()  # the pods' DNS names become 127.0.0.1 with a port each; every pod gets hydra.run.dir
    ports = iter(free_ports(2))
    command = [re.sub(r"[\w.-]+-node-0-\d+\.[\w-]+:\d+", lambda _: f"127.0.0.1:{next(ports)}", word)
               for word in _strategy_overrides(job["spec"]["trainer"]["command"])]  # fmt: skip
    tasks = []
    for index in range(2):
        env = {"JOB_COMPLETION_INDEX": str(index)}
        tasks.append(([*_kubernetes_expands(command, env), f"hydra.run.dir={tmp_path / 'run'}"], env))
    return tasks


@pytest.mark.e2e
@pytest.mark.slow  # 190-210 s a launcher on 2 cores shared with benchmarks (the Slurm run beside it: 90 s)
@pytest.mark.parametrize("launcher", ["skypilot", "trainjob"])
def test_two_tasks_train_on_a_launchers_variables_alone(tmp_path, launcher):
    """Two `python run.py` processes with the docs' strategy overrides and their launcher's variables (no
    TF_CONFIG): each gets its role and its half of the data, both end with the same weights, and only rank 0
    writes a run folder."""
    data = write_cifar(tmp_path / "cifar")
    env = {key: value for key, value in SUBPROCESS_ENV.items() if key not in LAUNCHER_VARIABLES}
    processes = []
    for rank, (overrides, variables) in enumerate(_launch(tmp_path, launcher)):
        scratch = tmp_path / f"tmp{rank}"
        scratch.mkdir()
        processes.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "run.py"), *tiny_overrides(data), *overrides],
                cwd=tmp_path,
                env={**env, **variables, "TMPDIR": str(scratch)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for rank, output in enumerate(outputs):
        assert f"Input pipeline {rank + 1} of 2 reads " in output, output[-2000:]
        assert "with 2 replica(s) <strategy=multi_worker>" in output
    shas = [re.findall(r"Final weights sha256 (\w+)", output) for output in outputs]
    assert shas[0] and shas[0] == shas[1], "identical final weights"
    run_dirs = [path.parent for path in tmp_path.rglob("metrics.json")]
    assert len(run_dirs) == 1, f"only rank 0, the chief, writes a run folder: {run_dirs}"
    assert json.loads((run_dirs[0] / "metrics.json").read_text())["weights_sha256"] == shas[0][-1]
    assert not list((tmp_path / "tmp1").iterdir()), "the other worker leaves no temporary folder"
