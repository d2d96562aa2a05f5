"""Cluster execution on one machine: a head and a second node started with ``ray start``.

Covers the launcher configs (against Ray's schema), the ``ray submit`` entry script, placement across nodes
and by custom resources (the grid's, a model's or a method's), an unplaceable grid failing at once, GPU
shares packed onto one (declared) GPU on a cluster of its own, a killed trial worker being retried, a killed
driver resuming, and ``ray job submit``. The cluster's processes carry a marker in their environment and are
ended by process id at the end of the module (never ``ray stop``, which would end every Ray on the machine,
the test session's own included).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from light_evaluation import LIGHT_EVALUATION as LIGHT  # quicker trials: no corruption sets, a small attack

pytestmark = pytest.mark.slow  # starts Ray or runs whole grids: not in the fast tier (-m "not slow")

ROOT = Path(__file__).resolve().parents[1]
RAY = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
URSA_RAY = shutil.which("ursa-ray") or str(Path(sys.executable).with_name("ursa-ray"))

TINY = {
    "name": "cluster_tiny",
    "methods": ["sgd", "mc_dropout"],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": ["digits"],
    "seeds": 4,
    "resources": {"cpu": 1},
    "budget": {"epochs": 2, "n_samples": 2, "batch_size": 128},
    "save_predictions": False,
}


# --------------------------------------------------------------------------------------------- no cluster


@pytest.mark.parametrize("name", ["local.yaml", "aws.yaml"])
def test_launcher_config_matches_rays_schema(name):
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = yaml.safe_load((ROOT / "cluster" / name).read_text())
    jsonschema.validate(config, schema)
    validate_config(prepare_config(config))  # what `ray up` checks before it contacts any machine
    assert any("pip install -e" in command for command in config["setup_commands"])
    if name == "local.yaml":
        assert config["provider"]["type"] == "local"
        assert config["provider"]["head_ip"] and isinstance(config["provider"]["worker_ips"], list)
    else:
        gpu = [t for t in config["available_node_types"].values() if t["resources"].get("GPU")]
        assert gpu and gpu[0]["node_config"]["InstanceType"].startswith("g5.")


def test_submit_entry_builds_the_run_command(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "cluster"))
    try:
        from submit_entry import build_argv
    finally:
        sys.path.remove(str(ROOT / "cluster"))
    monkeypatch.chdir(tmp_path)  # `ray submit` runs the script in the head's home directory
    argv = build_argv(["grids/quickstart.yaml", "--out", "/shared/results/q"])
    assert argv == ["run", str(ROOT / "grids" / "quickstart.yaml"), "--out", "/shared/results/q", "--address", "auto"]
    explicit = ["/abs/g.yaml", "--address", "10.0.0.1:6379"]
    assert build_argv(explicit) == ["run", *explicit]
    monkeypatch.setenv("URSA_RAY_HOME", str(tmp_path))
    (tmp_path / "mine.yaml").write_text("name: x\n")
    monkeypatch.chdir("/")
    assert build_argv(["mine.yaml"])[1] == str(tmp_path / "mine.yaml")


def test_fit_check_counts_node_types_the_autoscaler_may_add(ray_session, tmp_path, monkeypatch):
    from ursa_ray.grid import GridError, parse_grid
    from ursa_ray.tune import cluster

    grid = parse_grid(dict(TINY, resources={"cpu": 1, "gpu": 1}), str(tmp_path / "gpu.yaml"))
    monkeypatch.setattr(cluster, "LAUNCHER_CONFIG", tmp_path / "absent.yaml")
    with pytest.raises(GridError, match="GPU=1, which no node"):
        cluster.check_cluster_fits(grid)
    launcher = {
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "node_config": {}},
            "gpu_worker": {"min_workers": 0, "max_workers": 2, "resources": {"CPU": 8, "GPU": 1}, "node_config": {}},
        },
    }
    (tmp_path / "bootstrap.yaml").write_text(yaml.safe_dump(launcher))
    monkeypatch.setattr(cluster, "LAUNCHER_CONFIG", tmp_path / "bootstrap.yaml")
    cluster.check_cluster_fits(grid)  # the autoscaler can add a g5 worker: Tune waits for it
    launcher["available_node_types"]["gpu_worker"]["max_workers"] = 0
    (tmp_path / "bootstrap.yaml").write_text(yaml.safe_dump(launcher))
    with pytest.raises(GridError, match="GPU=1"):
        cluster.check_cluster_fits(grid)


def test_each_trial_asks_for_its_own_resources_and_the_fit_check_names_who_asks(ray_session, tmp_path, monkeypatch):
    from ursa_ray.grid import GridError, parse_grid
    from ursa_ray.tune import cluster, runner
    from ursa_ray.tune.queue import SpecQueue, seed_groups
    from ursa_ray.tune.trainable import config_specs, pack, placement

    methods = ["sgd", {"name": "mc_dropout", "resources": {"gpu": 0}}]  # the method's gpu wins over the model's
    models = [{"name": "mlp", "options": {"widths": [16]}}, {"name": "linear", "resources": {"gpu": 1}}]
    path = str(tmp_path / "g.yaml")
    grid = parse_grid(dict(TINY, methods=methods, models=models), path)
    queue = SpecQueue(seed_groups(grid.trial_specs()), str(tmp_path))  # the final trials' configs, as Tune gets them
    configs = []
    for i in range(len(queue.spec_table)):
        configs.append(queue.suggest(f"t{i}"))
        queue.on_trial_complete(f"t{i}")  # a transfer source done: its trials are handed out next
    asked = {
        (s.label, s.model): placement(config).required_resources
        for config in configs
        for s in config_specs(config, "", queue.spec_table)
    }
    assert asked == {
        ("sgd", "mlp"): {"CPU": 1.0},
        ("sgd", "linear"): {"CPU": 1.0, "GPU": 1.0},
        ("mc_dropout", "mlp"): {"CPU": 1.0},
        ("mc_dropout", "linear"): {"CPU": 1.0},
    }
    specs = grid.trial_specs()
    assert runner._requests(specs, grid) == (
        "per-trial resources (2 distinct requests: CPU=1 for sgd/mlp, mc_dropout/mlp, mc_dropout/linear; "
        "CPU=1, GPU=1 for sgd/linear)"
    )  # the final phase's first line
    assert runner._requests(parse_grid(TINY, path).trial_specs(), grid) == "CPU=1 each"
    search = grid.spec_for(grid.cells()[1], 0, "search", {})  # a search trial of sgd on linear
    assert placement({"spec": pack(search), "hp": {"lr": 0.1}}).required_resources == {"CPU": 1.0, "GPU": 1.0}
    monkeypatch.setattr(cluster, "LAUNCHER_CONFIG", tmp_path / "absent.yaml")
    with pytest.raises(GridError) as info:
        cluster.check_cluster_fits(grid)
    assert str(info.value).startswith(
        f"{path}: resources: method 'sgd' on model 'linear' asks for GPU=1, which no node of the Ray cluster has (nodes offer: "
    )
    methods[1] = "mc_dropout"  # now both methods ask for the GPU on linear
    with pytest.raises(GridError, match=r"'sgd' on model 'linear' \(and 1 other method/model pair\) asks for GPU=1"):
        cluster.check_cluster_fits(parse_grid(dict(TINY, methods=methods, models=models), path))
    cluster.check_cluster_fits(parse_grid(dict(TINY, methods=methods), path))  # nobody asks for a GPU: it fits


# ------------------------------------------------------------------------------------- the local cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _marked_pids(marker: str, title: bytes = b"", parent: int | None = None, contains: bytes = b"") -> list[int]:
    """Processes whose environment carries ``marker``, whose command line starts with ``title`` and contains
    ``contains``, and (if given) whose parent is ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if marker.encode() not in environ.split(b"\0") or not cmdline.startswith(title) or contains not in cmdline:
            continue
        if parent is None or ppid == parent:
            found.append(int(entry))
    return found


class LocalCluster:
    """A head and a second node on this machine, each with its own temp dir and custom resource; or, with
    ``second_node=False``, a head alone (``num_gpus``: GPUs it declares, which Ray hands out without any
    being there; ``dashboard=False``: no dashboard, a quicker start)."""

    def __init__(self, num_cpus: int = 1, num_gpus: int = 0, second_node: bool = True, dashboard: bool = True):
        self.num_cpus, self.num_gpus, self.second_node, self.with_dashboard = num_cpus, num_gpus, second_node, dashboard
        self.marker = f"URSA_TEST_CLUSTER={os.getpid()}-{secrets.token_hex(4)}"
        self.head_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must fit
        self.node_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
        self.port, self.dashboard_port = _free_port(), _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
        env.update(
            {
                self.marker.split("=")[0]: self.marker.split("=")[1],
                # token authentication, with a token of our own (not ~/.ray/auth_token)
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": secrets.token_hex(32),
                # `--address auto` finds this head through RAY_TMPDIR/ray/ray_current_cluster
                "RAY_TMPDIR": self.head_tmp,
                "PYTHONUNBUFFERED": "1",
                "RAY_USAGE_STATS_ENABLED": "0",
            }
        )
        self.env = env
        self.nodes: dict[str, str] = {}

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        common = [
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(self.num_cpus),
            "--object-store-memory",
            str(200 * 1024**2),
            "--disable-usage-stats",
        ]
        dashboard = (
            [
                "--include-dashboard",
                "true",
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(self.dashboard_port),
            ]
            if self.with_dashboard
            else ["--include-dashboard", "false"]
        )
        gpus = ["--num-gpus", str(self.num_gpus)] if self.num_gpus else []
        head = self.ray(
            "start", "--head", "--port", str(self.port), *common, *gpus, "--resources", '{"head_node": 1}', *dashboard,
            "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port()),
        )  # fmt: skip
        assert head.returncode == 0, head.stdout + head.stderr
        if self.second_node:
            self._start_second_node(common)
        probe = (
            f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False); "
            "print(json.dumps([[n['NodeID'], n['Resources']] for n in ray.nodes() if n['Alive']]))"
        )
        out = subprocess.run([sys.executable, "-c", probe], env=self.env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        for node_id, resources in json.loads(out.stdout.strip().splitlines()[-1]):
            for name in ("head_node", "second_node"):
                if name in resources:
                    self.nodes[name] = node_id
        expected = {"head_node", "second_node"} if self.second_node else {"head_node"}
        assert set(self.nodes) == expected, out.stdout

    def _start_second_node(self, common: list[str]) -> None:
        second = self.ray(
            "start", "--address", self.address, *common, "--resources", '{"second_node": 1}',
            "--temp-dir", self.node_tmp, "--dashboard-agent-listen-port", str(_free_port()),
        )  # fmt: skip
        assert second.returncode == 0, second.stdout + second.stderr

    def stop(self) -> list[int]:
        """End every process of this cluster (and its drivers) by id; returns those that would not end.  SIGTERM
        first, then SIGKILL after 0.5 s: the GCS server and raylets stay up for seconds after SIGTERM."""
        for sig, wait in ((signal.SIGTERM, 0.5), (signal.SIGKILL, 10.0)):
            for pid in _marked_pids(self.marker):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.time() + wait
            while _marked_pids(self.marker) and time.time() < deadline:
                time.sleep(0.2)
        left = _marked_pids(self.marker)
        for folder in (self.head_tmp, self.node_tmp):
            shutil.rmtree(folder, ignore_errors=True)
        return left


@pytest.fixture(scope="module")
def cluster():
    assert Path(RAY).exists(), f"the `ray` command (installed with ray) is missing: {RAY}"
    with _started(LocalCluster(), "test cluster") as local:
        yield local


@contextlib.contextmanager
def _started(local: LocalCluster, what: str) -> Iterator[LocalCluster]:
    try:
        local.start()
        yield local
    finally:
        left = local.stop()
        assert not left, f"processes of the {what} still running: {left}"


def _write_grid(folder: Path, name: str, **changes) -> Path:
    grid = {**TINY, "name": name, **changes}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _run(cluster: LocalCluster, args: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=cluster.env, capture_output=True, text=True, timeout=timeout, **kwargs)


def _ursa(*args: str) -> list[str]:
    return [sys.executable, "-m", "ursa_ray.cli", *args]


def _trials(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "trials.parquet")


def test_grid_runs_across_both_nodes(cluster, tmp_path):
    grid = _write_grid(tmp_path, "both", vectorize_seeds=1, **LIGHT)  # 8 one-seed trials, for both nodes to share
    out = tmp_path / "results"
    run = _run(cluster, _ursa("run", str(grid), "--out", str(out), "--address", cluster.address))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "on Ray (2 CPUs, 0 GPUs)" in run.stdout
    trials = _trials(out)
    assert len(trials) == 8 and trials["trial_id"].is_unique and (trials["status"] == "ok").all()
    assert set(trials["node_id"]) == set(cluster.nodes.values())  # ran on both nodes


def test_custom_resource_places_every_trial_on_its_node_via_submit_entry(cluster, tmp_path):
    # as `ray submit` does: the entry script copied to the head's home directory, run there, --address auto
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(ROOT / "cluster" / "submit_entry.py", home / "submit_entry.py")
    grid = _write_grid(tmp_path, "pinned", seeds=2, resources={"cpu": 1, "custom": {"second_node": 1}}, **LIGHT)
    out = tmp_path / "results"
    run = _run(cluster, [sys.executable, str(home / "submit_entry.py"), str(grid), "--out", str(out)], cwd=home)
    assert run.returncode == 0, run.stdout + run.stderr
    trials = _trials(out)
    assert len(trials) == 4 and (trials["status"] == "ok").all()
    assert set(trials["node_id"]) == {cluster.nodes["second_node"]}


def test_grid_no_node_can_place_fails_at_once(cluster, tmp_path):
    grid = _write_grid(tmp_path, "third", resources={"cpu": 1, "custom": {"third_node": 1}})
    out = tmp_path / "results"
    command = [URSA_RAY] if Path(URSA_RAY).exists() else _ursa()
    # an unplaceable trial would wait forever: the timeout is the failure, no wall time is asserted
    run = _run(cluster, [*command, "run", str(grid), "--out", str(out), "--address", "auto"], timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, run.stderr
    assert errors[0].startswith(f"error: {grid}: resources: each trial asks for third_node=1, which no node")
    assert errors[0].endswith("(nodes offer: CPU=1; CPU=1)")
    assert not out.exists()


def test_per_model_and_per_method_resources_place_each_trial_where_it_fits(cluster, tmp_path):
    # mlp trials ask for the head, linear ones for the second node, and mc_dropout on mlp for the second node too
    models = [
        {"name": "mlp", "options": {"widths": [16]}, "resources": {"custom": {"head_node": 1}}},
        {"name": "linear", "resources": {"custom": {"second_node": 1}}},
    ]
    methods = ["sgd", {"name": "mc_dropout", "models": ["mlp"], "resources": {"custom": {"second_node": 1}}}]
    grid = _write_grid(tmp_path, "per_model", methods=methods, models=models, seeds=2, **LIGHT)
    out = tmp_path / "results"
    run = _run(cluster, _ursa("run", str(grid), "--out", str(out), "--address", cluster.address))
    assert run.returncode == 0, run.stdout + run.stderr
    assert ("with per-trial resources (2 distinct requests: CPU=1, head_node=1 for sgd/mlp; "
            "CPU=1, second_node=1 for sgd/linear, mc_dropout/mlp)") in run.stdout, run.stdout  # fmt: skip
    trials = _trials(out)
    assert len(trials) == 6 and (trials["status"] == "ok").all()
    where = {(row.method, row.model): row.node_id for row in trials.itertuples()}
    assert where == {
        ("sgd", "mlp"): cluster.nodes["head_node"],
        ("sgd", "linear"): cluster.nodes["second_node"],
        ("mc_dropout", "mlp"): cluster.nodes["second_node"],
    }
    assert (trials["n_cpus"] == 1).all() and (trials["n_gpus"] == 0).all() and (trials["gpu_ids"] == "").all()


def test_a_method_request_no_node_can_place_names_the_method_and_model(cluster, tmp_path):
    methods = ["sgd", {"name": "mc_dropout", "resources": {"custom": {"third_node": 1}}}]
    grid = _write_grid(tmp_path, "third_method", methods=methods)
    out = tmp_path / "results"
    run = _run(cluster, _ursa("run", str(grid), "--out", str(out), "--address", cluster.address), timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {grid}: resources: method 'mc_dropout' on model 'mlp' asks for third_node=1, which no node of the "
        "Ray cluster has (nodes offer: CPU=1; CPU=1)"
    ], run.stderr
    assert "final phase" not in run.stdout and not out.exists()  # no trial started


def test_killed_trial_worker_is_retried_and_results_are_complete(cluster, tmp_path):
    grid = _write_grid(tmp_path, "retry", methods=["sgd"], seeds=3, max_failures=2,
                       budget={"epochs": 30, "n_samples": 2, "batch_size": 64}, **LIGHT)  # fmt: skip
    # one seed a trial: four trials, so the second node gets one (a single batched trial may land on the head)
    out = tmp_path / "results"
    process = subprocess.Popen(
        _ursa("run", str(grid), "--out", str(out), "--address", cluster.address),
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        killed = None
        deadline = time.time() + 120
        while killed is None and time.time() < deadline and process.poll() is None:
            running = _marked_pids(cluster.marker, title=b"ray::ImplicitFunc.train")
            if running:  # the worker is executing a trial (its process title says so): kill it there
                os.kill(running[0], signal.SIGKILL)
                killed = running[0]
            time.sleep(0.1)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    print(output)
    assert killed is not None, "no running trial process was found"
    assert process.returncode == 0, output
    retries = [line for line in output.splitlines() if line.startswith("retry 1/2 final ")]
    assert len(retries) == 1, output
    trials = _trials(out)
    assert len(trials) == 3 and trials["trial_id"].is_unique and (trials["status"] == "ok").all()
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert metrics.groupby("trial_id").size().nunique() == 1 and not metrics.duplicated().any()


def test_killed_driver_then_rerun_finishes_every_trial_once(cluster, tmp_path):
    grid = _write_grid(tmp_path, "resume", seeds=3, budget={"epochs": 30, "n_samples": 3, "batch_size": 64}, **LIGHT)
    out = tmp_path / "results"
    command = _ursa("run", str(grid), "--out", str(out), "--address", cluster.address)
    process = subprocess.Popen(command, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("[1/6]"):
                process.send_signal(signal.SIGKILL)
                break
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    print("".join(lines))
    assert process.returncode == -signal.SIGKILL, "".join(lines)
    partial = _trials(out)
    assert 0 < len(partial) < 6, "".join(lines)  # some, not all, trials finished before the kill
    rerun = _run(cluster, command)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"final phase: 6 trials ({len(partial)} already finished)" in rerun.stdout
    assert f"{len(partial)} already finished; results in" in rerun.stdout
    trials = _trials(out)
    assert len(trials) == 6 and trials["trial_id"].is_unique and (trials["status"] == "ok").all()
    assert set(partial["trial_id"]) <= set(trials["trial_id"])
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert metrics.groupby("trial_id").size().nunique() == 1 and not metrics.duplicated().any()


def test_ray_job_submit_runs_a_grid(cluster, tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    _write_grid(job_dir, "grid", seeds=1, **LIGHT)
    out = tmp_path / "results"  # absolute: the job's working directory is a temporary copy on the head
    run = _run(
        cluster,
        [RAY, "job", "submit", "--address", cluster.dashboard, "--working-dir", str(job_dir), "--",
         "python", "-m", "ursa_ray.cli", "run", "grid.yaml", "--out", str(out), "--address", "auto"],
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "succeeded" in run.stdout + run.stderr
    trials = _trials(out)
    assert len(trials) == 2 and (trials["status"] == "ok").all()


@pytest.fixture
def gpu_cluster():
    """A one-node cluster declaring one GPU (Ray hands it out though there is none), its own ports and temp dir.

    Four CPUs: a node starts as many worker processes at once as it has CPUs.  With a searcher of its own
    (the final phase's SpecQueue) Tune keeps one trial pending unless told otherwise, so workers would start
    one by one and the four GPU shares would not overlap; ``run_trials`` tells it (``_pending_trials``)."""
    with _started(
        LocalCluster(num_cpus=4, num_gpus=1, second_node=False, dashboard=False), "GPU test cluster"
    ) as local:
        yield local


def test_gpu_shares_pack_onto_one_gpu_and_a_whole_gpu_runs_alone(gpu_cluster, tmp_path):
    """Four trials asking for a quarter of the one GPU run on it at once; a trial asking for the whole GPU runs
    alone.  Each records the GPU Ray assigned it; torch sees none here, so they train on the CPU."""
    import torch

    methods = [
        {"name": "sgd", "label": "whole_gpu", "vectorize_seeds": 4, "resources": {"gpu": 1}},  # one trial, first
        {"name": "sgd", "vectorize_seeds": 1, "resources": {"gpu": 0.25}},
    ]  # four trials
    grid = _write_grid(tmp_path, "gpu_packing", methods=methods, resources={"cpu": 0.25},
                       budget={"epochs": 20, "n_samples": 2, "batch_size": 64}, **LIGHT)  # fmt: skip
    out = tmp_path / "results"
    run = _run(gpu_cluster, _ursa("run", str(grid), "--out", str(out), "--address", gpu_cluster.address))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "on Ray (4 CPUs, 1 GPUs)" in run.stdout, run.stdout
    trials = _trials(out)
    assert len(trials) == 8 and (trials["status"] == "ok").all(), trials[["method", "status", "error"]]
    whole, quarter = trials[trials["method"] == "whole_gpu"], trials[trials["method"] == "sgd"]
    assert (whole["seeds_in_trial"] == 4).all() and (quarter["seeds_in_trial"] == 1).all()
    assert (whole["n_gpus"] == 1).all() and (quarter["n_gpus"] == 0.25).all() and (trials["n_cpus"] == 0.25).all()
    assert (trials["gpu_ids"] == "[0]").all(), trials["gpu_ids"]
    spans = trials[["method", "started_at", "finished_at"]].to_string()
    assert quarter["started_at"].max() < quarter["finished_at"].min(), spans  # all four were running at once
    start, end = whole["started_at"].iloc[0], whole["finished_at"].iloc[0]
    assert ((quarter["finished_at"] <= start) | (quarter["started_at"] >= end)).all(), spans  # none beside it
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert trials["device"].str.startswith(device).all(), trials["device"]


def test_lost_node_loses_no_finished_result(cluster, tmp_path):
    """Last in the module: it ends the second node. Its trials are retried on the head; nothing is lost."""
    grid = _write_grid(tmp_path, "lost", methods=["sgd"], seeds=4, max_failures=1, vectorize_seeds=1,
                       budget={"epochs": 30, "n_samples": 2, "batch_size": 64}, **LIGHT)  # fmt: skip
    # one seed a trial: four trials, so the second node gets one (a single batched trial may land on the head)
    out = tmp_path / "results"
    raylets = _marked_pids(cluster.marker, contains=b"raylet_socket_name=" + cluster.node_tmp.encode())
    assert len(raylets) == 1
    process = subprocess.Popen(
        _ursa("run", str(grid), "--out", str(out), "--address", cluster.address),
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lost = False
        deadline = time.time() + 120
        while not lost and time.time() < deadline and process.poll() is None:
            if _marked_pids(cluster.marker, title=b"ray::ImplicitFunc.train", parent=raylets[0]):
                # a trial is executing on the second node (its worker's process title says so): the node goes away
                node = set(raylets) | set(_marked_pids(cluster.marker, parent=raylets[0]))
                node |= set(_marked_pids(cluster.marker, contains=cluster.node_tmp.encode()))
                for pid in node:
                    os.kill(pid, signal.SIGKILL)
                lost = True
            time.sleep(0.1)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    print(output)
    assert lost, "no trial ran on the second node"
    assert process.returncode == 0, output
    assert any(line.startswith("retry 1/1 final ") for line in output.splitlines()), output
    trials = _trials(out)
    assert len(trials) == 4 and trials["trial_id"].is_unique and (trials["status"] == "ok").all()
