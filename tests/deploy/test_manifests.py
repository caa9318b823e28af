"""deploy/: the worker Deployment and the KEDA ScaledObject agree with the ``lbs worker`` command,
the lbs-prometheus plugin and lbs.Config, read from the code, not from a copy of it.

The args and every variable of the worker's container are ones ``lbs worker`` (or a plugin it
loads) reads; ``lbs worker ... --check`` resolves them; the startup and liveness probes ask
lbs-prometheus's liveness path and the readiness probe its readiness path, on the port it serves;
the grace period covers drain_timeout and the hand-back; the KEDA triggers name the service's LBS,
group and parked-retry stream, and KEDA connects with the Secret's user, password and TLS settings;
evictions take one pod at a time (pdb.yaml); the pod mounts no API token and is annotated for a
scrape of the metrics port (monitoring/, optional, scrapes it for the Prometheus Operator);
`kubectl kustomize` builds the kit where kubectl is installed. Then the container's command runs
for real against a Redis: /livez and /readyz answer 200, /metrics serves lbs's metrics, the
consumer id is the pod's name, and SIGTERM ends it cleanly within the grace period; with Redis
stopped it stays alive (/livez 200) and unready (/readyz 503), and both are 200 again once Redis
is back. The image is built only where a container engine runs (skipped otherwise, saying so).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
import typer
import yaml
from _manifests import (
    DEPLOY,
    K8S,
    ROOT,
    documents,
    kustomization,
    one,
    scaled_object,
    selects,
    trigger,
    worker,
)
from redis.backoff import NoBackoff
from redis.retry import Retry

import lbs
from lbs import _keys
from lbs.cli import app
from lbs.cli.settings import COMMAND_ENV, FIELDS, env_name
from lbs.config import Config
from lbs.embedded import RedisServer, free_port

lbs_prometheus = pytest.importorskip("lbs_prometheus")

#: Variables the pod sets for others than lbs: KEDA's scaler reads REDIS_ADDRESS (addressFromEnv).
FOR_KEDA = {"REDIS_ADDRESS"}
#: What `lbs worker` reads outside its options and lbs.Config: the consumer id (cli/worker.py).
CONSUMER_ID_ENV = {"POD_NAME", "POD_IP"}


def _worker_command() -> Any:
    return typer.main.get_command(app).commands["worker"]  # type: ignore[attr-defined]


def _options() -> set[str]:
    return {o for p in _worker_command().params for o in [*p.opts, *p.secondary_opts]}


def _option_envvars() -> set[str]:
    out: set[str] = set()
    for p in _worker_command().params:
        env = getattr(p, "envvar", None)
        out.update([env] if isinstance(env, str) else env or [])
    return out


def _config() -> Config:
    """The Config the container's LBS_<FIELD> variables make."""
    fields = {n for n in FIELDS if env_name(n) in worker().values()}
    from lbs.cli.settings import parse_text

    return Config(**{n: parse_text(n, worker().values()[env_name(n)], n) for n in fields})


def test_kustomization_lists_the_manifests_and_every_file_parses() -> None:
    kit = kustomization()
    assert kit["resources"] == ["worker.yaml", "pdb.yaml", "keda.yaml"]
    for path in K8S.rglob("*.yaml"):
        assert documents(str(path.relative_to(K8S))), path
    # The example Secret stays out of `kubectl apply -k`: a real password never sits in the repository.
    assert "secret.example.yaml" not in kit["resources"]


def test_the_args_are_worker_options() -> None:
    args = worker().args
    positional = [a for a in args if not a.startswith("-")]
    flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    assert re.fullmatch(r"[\w.]+:\w+", positional[0]), "the first arg is MODULE:HANDLER"
    unknown = set(flags) - _options()
    assert not unknown, f"not options of `lbs worker`: {unknown}"


def test_every_variable_is_read_by_lbs_worker_or_its_plugins() -> None:
    known = (
        _option_envvars()
        | COMMAND_ENV
        | {env_name(n) for n in FIELDS}
        | {lbs_prometheus.PORT_ENV, lbs_prometheus.ADDR_ENV, lbs_prometheus.LIVE_TIMEOUT_ENV}
        | CONSUMER_ID_ENV
        | FOR_KEDA
    )
    unknown = set(worker().env) - known
    assert not unknown, f"variables nothing reads: {unknown}"
    # The ones the brief puts in the environment: the URL from a Secret, the service, the settings.
    assert worker().secret_of("LBS_URL")[1] == "url"
    assert "LBS_URL" in _option_envvars() and "LBS_SERVICE" in _option_envvars()
    for name in ("LBS_DRAIN_TIMEOUT", "LBS_LOCK_TTL", "LBS_MAX_STREAMS"):
        assert name in worker().values(), name


def test_the_consumer_id_is_the_pod_name() -> None:
    field = worker().env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == "metadata.name"
    # lbs.consumer_id_from_env (what `lbs worker` calls) makes it the consumer's name.
    os.environ["POD_NAME"] = "orders-worker-7d9f-abcde"
    try:
        assert lbs.consumer_id_from_env() == "redis-consumer-orders-worker-7d9f-abcde"
    finally:
        del os.environ["POD_NAME"]


def _app_dir(tmp_path: Path) -> Path:
    """A directory holding the module the Deployment's MODULE:HANDLER names."""
    module, handler = worker().args[0].split(":")
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(tmp_path).parents:
        if parent != Path("."):
            (tmp_path / parent / "__init__.py").touch()
    path.write_text(f"async def {handler}(note):\n    return None\n")
    return tmp_path


def _pod_env(url: str, **extra: str) -> dict[str, str]:
    """The container's environment, as the kubelet builds it, around this machine's PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LBS_")}
    env.update(worker().values())
    env.update(POD_NAME="orders-worker-5c6d7-x2kfp", LBS_URL=url, REDIS_ADDRESS="unused:6379")
    env.update(extra)
    return env


def test_lbs_worker_check_accepts_the_container(tmp_path: Path) -> None:
    """The container's args and environment, resolved by `lbs worker --check` (connects to nothing)."""
    env = _pod_env("redis://:secret@127.0.0.1:1/0", LBS_LOAD_PLUGINS="")
    done = subprocess.run(
        [sys.executable, "-m", "lbs", "worker", *worker().args, "--check"],
        cwd=_app_dir(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "did you mean" not in done.stderr, done.stderr
    table = done.stdout
    cfg = _config()
    assert f"drain_timeout = {cfg.drain_timeout}" in table
    assert f"lock_ttl = {cfg.lock_ttl}" in table and f"max_streams = {cfg.max_streams}" in table


#: Which check each probe asks: a probe that restarts the pod (startup, liveness) never waits on
#: Redis; readiness does.
PROBE_PATHS = {
    "startupProbe": lbs_prometheus.LIVE_PATH,
    "livenessProbe": lbs_prometheus.LIVE_PATH,
    "readinessProbe": lbs_prometheus.READY_PATH,
}


def _live_timeout() -> float:
    """How long the pod's /livez waits for the event loop (LBS_PROMETHEUS_LIVE_TIMEOUT or the default)."""
    raw = worker().values().get(lbs_prometheus.LIVE_TIMEOUT_ENV)
    return float(raw) if raw is not None else lbs_prometheus.LIVE_TIMEOUT


def test_probes_ask_livez_and_readyz_on_the_port_lbs_prometheus_serves() -> None:
    w = worker()
    port = int(w.values()[lbs_prometheus.PORT_ENV])
    assert w.port("metrics") == port
    # The kubelet probes the pod's IP: loopback (the plugin's default) would fail every probe.
    assert w.values()[lbs_prometheus.ADDR_ENV] not in ("127.0.0.1", "localhost", "::1")
    for kind, path in PROBE_PATHS.items():
        probe = w.container[kind]
        get = probe["httpGet"]
        assert get["path"] == path, kind
        assert get["port"] in ("metrics", port), kind
        if path == lbs_prometheus.LIVE_PATH:
            # /livez answers within its bound (503 for a blocked loop): the kubelet waits longer,
            # so a failure says why rather than timing out.
            assert probe.get("timeoutSeconds", 1) > _live_timeout(), kind


def test_a_blocked_loop_is_restarted_only_after_a_lock_ttl() -> None:
    """Liveness restarts a pod whose loop failed three probes in a row: not before a lock TTL, the
    time a blocked loop may pause without losing a lock."""
    live = worker().container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= _config().lock_ttl
    startup = worker().container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60, (
        "time to import and connect"
    )


def test_grace_period_covers_the_drain_and_the_hand_back() -> None:
    cfg, pod = _config(), worker().pod
    grace = pod["terminationGracePeriodSeconds"]
    # After the drain: the finisher's drain and the keyed commits, each bounded by read_block + 5
    # (_consumer/lifecycle.py), and the process's exit.
    hand_back = 2 * (cfg.read_block + 5.0)
    assert grace >= cfg.drain_timeout + hand_back + 2, (grace, cfg.drain_timeout, hand_back)
    # A preStop would spend the grace period before SIGTERM starts the drain: there is none.
    assert "lifecycle" not in worker().container


def test_keda_reads_the_service_s_lbs_group_and_parked_retries() -> None:
    w, so = worker(), scaled_object()
    service = w.service
    assert so["spec"]["scaleTargetRef"]["name"] == w.deployment["metadata"]["name"]
    backlog = trigger("backlog")
    assert backlog["stream"] == lbs.input_stream(service)
    assert backlog["consumerGroup"] == lbs.group_name(service)
    assert int(backlog["lagCount"]) > 0 and backlog["activationLagCount"] == "0"
    unfinished = trigger("unfinished")
    assert unfinished["stream"] == lbs.input_stream(service)
    assert "consumerGroup" not in unfinished, "XLEN mode is the one without a group"
    # A pod per what one pod holds at once.
    assert int(unfinished["streamLength"]) == _config().max_streams
    parked = trigger("parked-retries")
    assert parked["stream"] == _keys.delayed_stream(service)
    assert "consumerGroup" not in parked
    for t in so["spec"]["triggers"]:
        meta = t["metadata"]
        assert meta["addressFromEnv"] in w.env, (
            "KEDA resolves addressFromEnv from the target's container"
        )
        assert t["authenticationRef"]["name"] == "lbs-redis"
    assert so["spec"]["minReplicaCount"] == 0


def test_the_trigger_authentication_reads_the_worker_s_secret() -> None:
    (auth,) = [d for d in documents("keda.yaml") if d["kind"] == "TriggerAuthentication"]
    secret, _ = worker().secret_of("LBS_URL")
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs["password"][0] == secret
    (example,) = documents("secret.example.yaml")
    assert example["metadata"]["name"] == secret
    assert {"url", "address", "password"} <= set(example["stringData"])
    assert worker().secret_of("REDIS_ADDRESS") == (secret, "address")


#: Where the pod's scrape annotations point: lbs-prometheus answers /metrics with the exposition.
METRICS_PATH = "/metrics"


def test_a_disruption_budget_lets_evictions_take_one_worker_at_a_time() -> None:
    """pdb.yaml: node drains evict one worker at a time (each drains and hands back on SIGTERM like
    any stop), whatever KEDA's replica count, and never wait on Redis."""
    assert "pdb.yaml" in kustomization()["resources"]
    pdb = one("pdb.yaml", "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    spec = pdb["spec"]
    assert selects(spec["selector"], worker().labels), "the budget selects the worker's pods"
    assert spec["selector"] == worker().deployment["spec"]["selector"], "and only them"
    # One at a time, however many pods KEDA runs: a fixed minAvailable would refuse every eviction
    # while it runs a single pod (minReplicaCount 0, so often one), and a drain would hang on it.
    assert spec["maxUnavailable"] == 1 and "minAvailable" not in spec
    assert scaled_object()["spec"]["minReplicaCount"] <= 1
    # An evicted pod stops like any other: the grace period covers its drain and hand-back
    # (test_grace_period_covers_the_drain_and_the_hand_back), so a budget of one loses nothing.
    assert worker().pod["terminationGracePeriodSeconds"] >= _config().drain_timeout
    # Readiness waits on Redis (/readyz): in an outage every pod is unready, and only AlwaysAllow
    # keeps unready pods evictable (the default, IfHealthyBudget, would block every drain).
    assert worker().container["readinessProbe"]["httpGet"]["path"] == lbs_prometheus.READY_PATH
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_pod_is_annotated_for_a_scrape_of_the_port_lbs_prometheus_serves() -> None:
    """prometheus.io/* annotations name the port lbs-prometheus opens (LBS_PROMETHEUS_PORT, set:
    without it the plugin opens none) on an address Prometheus reaches, and its metrics path."""
    w = worker()
    annotations = w.annotations
    assert all(isinstance(v, str) for v in annotations.values()), "annotation values are strings"
    assert annotations["prometheus.io/scrape"] == "true"
    port = int(w.values()[lbs_prometheus.PORT_ENV])
    assert int(annotations["prometheus.io/port"]) == port == w.port("metrics")
    assert annotations["prometheus.io/path"] == METRICS_PATH
    assert w.values()[lbs_prometheus.ADDR_ENV] not in ("127.0.0.1", "localhost", "::1")


def test_the_optional_service_monitor_scrapes_every_worker_ready_or_not() -> None:
    """monitoring/: a Service of the worker pods (unready ones too: a Redis outage makes them all
    unready) and a ServiceMonitor of its metrics port; a kustomize component, not applied by
    default (its kind needs the Prometheus Operator's CRDs)."""
    (component,) = documents("monitoring/kustomization.yaml")
    assert component["kind"] == "Component"
    assert component["resources"] == ["servicemonitor.yaml"]
    kit = kustomization()
    assert "monitoring" not in kit["resources"] and "components" not in kit
    assert "#   - monitoring" in (K8S / "kustomization.yaml").read_text(), "says how to add it"
    w = worker()
    service = one("monitoring/servicemonitor.yaml", "Service")
    assert selects({"matchLabels": service["spec"]["selector"]}, w.labels)
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["clusterIP"] == "None", "headless: a worker receives no traffic"
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in ("metrics", w.port("metrics"))
    monitor = one("monitoring/servicemonitor.yaml", "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"]
    assert endpoint["path"] == w.annotations["prometheus.io/path"] == METRICS_PATH


def test_the_pod_mounts_no_service_account_token() -> None:
    """Nothing in the pod calls the Kubernetes API: its own ServiceAccount, and no token mounted."""
    pod = worker().pod
    assert pod["automountServiceAccountToken"] is False
    (account,) = [d for d in documents("worker.yaml") if d["kind"] == "ServiceAccount"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    volumes = json.dumps(pod.get("volumes", []))
    assert "serviceAccountToken" not in volumes, "no projected token either"


#: What keda.yaml's TriggerAuthentication passes to the redis-streams scaler (KEDA's parameter
#: names: the ACL user, TLS "enable"/"disable", and the PEM of a CA and of a client certificate).
KEDA_AUTH = {"username", "password", "tls", "ca", "cert", "key"}


def test_keda_reads_the_acl_user_and_tls_from_the_secret() -> None:
    """KEDA reaches what `url` may name, a TLS-only or ACL-protected Redis: every connection
    parameter comes from the worker's Secret, and the example Secret has each key."""
    auth = one("keda.yaml", "TriggerAuthentication")
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == KEDA_AUTH
    secret, _ = worker().secret_of("LBS_URL")
    assert {name for name, _ in refs.values()} == {secret}
    (example,) = documents("secret.example.yaml")
    assert {key for _, key in refs.values()} <= set(example["stringData"])
    assert example["stringData"][refs["tls"][1]] in ("enable", "disable")
    for t in scaled_object()["spec"]["triggers"]:
        meta = t["metadata"]
        # KEDA refuses `tls` in both the TriggerAuthentication and the metadata (enableTLS), and
        # credentials written in the metadata would bypass the Secret.
        assert not {"enableTLS", "unsafeSsl"} & set(meta), t["name"]
        assert not {k for k in meta if k.startswith(("username", "password"))}, t["name"]
        assert t["authenticationRef"]["name"] == auth["metadata"]["name"]


def test_the_example_secret_gives_keda_the_server_of_its_url() -> None:
    """secret.example.yaml: KEDA's keys name the server, user, password and TLS of `url`, and the
    example is the case KEDA could not reach before (rediss:// with an ACL user)."""
    (example,) = documents("secret.example.yaml")
    data = example["stringData"]
    url = urllib.parse.urlsplit(data["url"])
    assert url.scheme == "rediss" and url.username, "the example is a TLS-only, ACL-protected Redis"
    assert data["address"] == f"{url.hostname}:{url.port or 6379}"
    assert data["username"] == urllib.parse.unquote(url.username or "")
    assert data["password"] == urllib.parse.unquote(url.password or "")
    assert data["tls"] == ("enable" if url.scheme.startswith("rediss") else "disable")
    assert worker().secret_of("REDIS_ADDRESS") == (example["metadata"]["name"], "address")


def _kustomize(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize path``: the documents `kubectl apply -k` would send."""
    done = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def test_kustomize_builds_the_kit_and_the_monitoring_component(tmp_path: Path) -> None:
    """`kubectl apply -k deploy/k8s` sends the worker, its account, its budget and KEDA's objects
    (no Secret); with the monitoring component, the Service and ServiceMonitor as well."""
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl on this machine; the manifests' contents are tested above")
    kinds = sorted(d["kind"] for d in _kustomize(K8S))
    expected = ["Deployment", "PodDisruptionBudget", "ScaledObject", "ServiceAccount"]
    assert kinds == sorted([*expected, "TriggerAuthentication"])
    kit = os.path.relpath(K8S, tmp_path)  # kustomize takes no absolute paths
    overlay = {"resources": [kit], "components": [f"{kit}/monitoring"]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    kinds = sorted(d["kind"] for d in _kustomize(tmp_path))
    assert kinds == sorted([*expected, "TriggerAuthentication", "Service", "ServiceMonitor"])


def test_the_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert 'ENTRYPOINT ["lbs", "worker"]' in text
    assert re.search(r"^USER 10001", text, re.M), "a numeric non-root user (runAsNonRoot checks it)"
    assert worker().pod["securityContext"]["runAsUser"] == 10001
    version = re.search(r"^ARG LBS_VERSION=(\S+)", text, re.M)
    assert version and version.group(1) == lbs.__version__
    assert (
        "lbs-streams[${LBS_EXTRAS}]==${LBS_VERSION}" in text and "ARG LBS_EXTRAS=prometheus" in text
    )
    assert f"EXPOSE {worker().port('metrics')}" in text


def _engine() -> str | None:
    """Why no image can be built here, or None when a container engine answers."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker command"
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return (
            "the docker command finds no engine: " + (info.stderr.strip().splitlines() or ["?"])[-1]
        )
    return None


def test_the_image_builds_and_runs() -> None:
    why = _engine()
    if why is not None:
        pytest.skip(
            f"no container engine on this machine ({why}); everything else of deploy/ is tested"
        )
    dist = ROOT / "dist"
    if not list(dist.glob(f"lbs_streams-{lbs.__version__}-*.whl")):
        pytest.skip("no wheel in dist/: run `make wheel` first")
    tag = f"lbs-worker-test:{lbs.__version__}"
    build = subprocess.run(
        ["docker", "build", "-f", str(DEPLOY / "Dockerfile"), "-t", tag, str(dist)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    version = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "lbs", tag, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert version.stdout.strip() == f"lbs {lbs.__version__}"
    user = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True, text=True
    )
    assert user.stdout.strip() == "10001"


def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """GET ``path`` as the kubelet does: (status, JSON body); OSError while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _scrape(port: int, path: str) -> tuple[int, str, str]:
    """GET ``path`` as Prometheus does: (status, content type, body)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


async def _until(port: int, path: str, status: int, timeout: float, log: Path) -> dict[str, Any]:
    """Poll ``path`` until it answers ``status`` (bounded); its body."""
    deadline = time.monotonic() + timeout
    got: tuple[int, dict[str, Any]] | None = None
    while time.monotonic() < deadline:
        try:
            got = await asyncio.to_thread(_probe, port, path)
            if got[0] == status:
                return got[1]
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"{path} not {status} within {timeout}s: {got}\n{log.read_text()[-3000:]}")


class _Pod:
    """The container's command (`lbs worker` with the pod's args and environment) in a subprocess."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.port = free_port()
        self.env = _pod_env(
            url,
            LBS_PROMETHEUS_PORT=str(self.port),
            LBS_LOAD_PLUGINS="prometheus",
            LBS_SERVICE=f"pod-{self.port}",
        )
        self.log = tmp_path / "worker.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lbs", "worker", *worker().args],
                cwd=_app_dir(tmp_path),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def until(self, path: str, status: int, timeout: float = 60) -> dict[str, Any]:
        return await _until(self.port, path, status, timeout, self.log)

    def stop_within_grace(self) -> None:
        """SIGTERM: a clean exit (0) within the grace period."""
        grace = worker().pod["terminationGracePeriodSeconds"]
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=grace)
        assert code == 0, self.log.read_text()[-3000:]
        assert time.monotonic() - started < grace

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.integration
async def test_the_container_runs_livez_readyz_and_stops_within_its_grace(
    redis_server: Any, tmp_path: Path
) -> None:
    """The container's command and environment (the pod name, the settings, lbs-prometheus on
    0.0.0.0) against a real Redis: alive and ready, named after its pod, its metrics where the scrape
    annotations say, and gone within the grace period."""
    pod = _Pod(redis_server.url, tmp_path)
    try:
        ready = await pod.until(PROBE_PATHS["readinessProbe"], 200)
        (client,) = ready["clients"]
        assert client["consumer"] == "redis-consumer-" + pod.env["POD_NAME"]
        assert client["service"] == pod.env["LBS_SERVICE"]
        live = await pod.until(PROBE_PATHS["livenessProbe"], 200, timeout=10)
        assert [c["consumer"] for c in live["clients"]] == [client["consumer"]]
        await pod.until(lbs_prometheus.HEALTH_PATH, 200, timeout=10)  # the old name still answers
        # What the scrape annotations promise: the exposition, lbs's metrics in it, on their path.
        path = worker().annotations["prometheus.io/path"]
        status, content_type, body = await asyncio.to_thread(_scrape, pod.port, path)
        assert status == 200 and content_type.startswith("text/plain"), (status, content_type)
        assert re.search(rf"^{lbs_prometheus.PREFIX}\w+", body, re.M), body[:2000]
        pod.stop_within_grace()
    finally:
        pod.kill()


def _shut_down(server: RedisServer) -> None:
    """SHUTDOWN SAVE: Redis goes away (its data kept for its return)."""
    assert server.process is not None
    with server.client(socket_timeout=10, retry=Retry(NoBackoff(), 0)) as c:
        try:
            c.shutdown(save=True)
        except redis.exceptions.ConnectionError:
            pass  # the server closes the connection as it exits
    server.process.wait(timeout=30)


@pytest.mark.integration
@pytest.mark.timeout(240)
async def test_a_redis_outage_leaves_the_pod_alive_and_unready(tmp_path: Path) -> None:
    """Redis stops under a running pod: the probes that restart it (startup, liveness) keep
    answering 200 while readiness answers 503 naming the late heartbeat; Redis back, both 200, and
    the pod still stops cleanly. (Before /livez, liveness asked /healthz: every pod restarted.)"""
    live_path, ready_path = PROBE_PATHS["livenessProbe"], PROBE_PATHS["readinessProbe"]
    with RedisServer() as server:  # its own, to stop; started from this (the main) thread
        pod = _Pod(server.url, tmp_path)
        try:
            await pod.until(ready_path, 200)
            await pod.until(live_path, 200, timeout=10)
            _shut_down(server)
            # The heartbeat is late after 2 x lock_ttl/3: not ready. Alive at every probe till then.
            deadline = time.monotonic() + 60
            while (ready := await asyncio.to_thread(_probe, pod.port, ready_path))[0] != 503:
                assert time.monotonic() < deadline, f"still {ready} with Redis down"
                status, body = await asyncio.to_thread(_probe, pod.port, live_path)
                assert status == 200, body
                await asyncio.sleep(0.2)
            (late,) = ready[1]["unhealthy"]
            assert late["reason"].startswith("no heartbeat for"), late
            for _ in range(10):  # deeper into the outage: alive, and the process still runs
                status, body = await asyncio.to_thread(_probe, pod.port, live_path)
                assert status == 200 and body["status"] == "ok", body
                await asyncio.sleep(0.3)
            assert pod.proc.poll() is None, pod.log.read_text()[-3000:]

            server.restart()  # the same port and data (its SHUTDOWN meets a closed port)
            await pod.until(ready_path, 200)
            await pod.until(live_path, 200, timeout=10)
            pod.stop_within_grace()
        finally:
            pod.kill()


def test_manifests_are_plain_yaml_without_templating() -> None:
    for path in K8S.rglob("*.yaml"):
        text = path.read_text()
        assert "{{" not in text, f"{path.name}: plain YAML, no templating"
        yaml.safe_load_all(text)
