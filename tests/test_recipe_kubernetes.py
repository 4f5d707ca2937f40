"""The Kubernetes recipe (deploy/kubernetes/): every manifest parses, and what ties its pieces together
holds. The learner's Service selects the learner pod and forwards the ports it binds, and the actors
dial that Service by its DNS name on the same ports. The run dir is on the StatefulSet's claim, the
learner gets a GPU, and the key files the flags name are the keys of the Secrets that are mounted
there. The emulators mount /dev/kvm and report booted through sys.boot_completed, and their serials
are the ones the actor attaches to. Every flag exists in `python -m learner --help` /
`python -m actors --help` (run here), and the whole commands parse with the CLI's own config classes,
so the manifests cannot drift from the CLI. Nothing here talks to a cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tyro
import yaml
import zmq.auth

from actors.config import ActorConfig
from common.net.curve import CurveClient, CurveServer, generate
from learner.config import LearnerConfig
from tests.argv_words import value as _value
from tests.argv_words import values as _values
from tests.conftest import ROOT

K8S = ROOT / "deploy" / "kubernetes"
TEMPLATE = "secrets.template.yaml"
API_VERSIONS = {
    "Namespace": "v1",
    "Service": "v1",
    "Secret": "v1",
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
ENV_REF = re.compile(r"\$\((\w+)\)")


# ---- loading -------------------------------------------------------------------------------------------


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]


def _manifests() -> list[str]:
    return sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    """Every object of every manifest (the Secret template included), by (kind, name)."""
    found: dict[tuple[str, str], dict] = {}
    for name in _manifests():
        for doc in _docs(name):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{key} is defined twice"
            found[key] = doc
    return found


def _pod(objects, kind: str, name: str) -> dict:
    return objects[(kind, name)]["spec"]["template"]["spec"]


def _container(pod: dict, name: str) -> dict:
    (found,) = [c for c in [*pod.get("initContainers", []), *pod["containers"]] if c["name"] == name]
    return found


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _expand(words: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) substitution in command and args (an unknown VAR would stay literal: an error)."""

    def sub(m: re.Match) -> str:
        assert m.group(1) in env, f"$({m.group(1)}) is not in the container's env"
        return env[m.group(1)]

    return [ENV_REF.sub(sub, w) for w in words]


def _learner(objects) -> tuple[dict, list[str]]:
    """The learner container and the arguments after `python -m learner` (env references expanded)."""
    c = _container(_pod(objects, "StatefulSet", "distrl-learner"), "learner")
    assert c["args"][:3] == ["python", "-m", "learner"], c["args"][:3]
    return c, _expand(c["args"][3:], _env(c))


def _actor(objects) -> tuple[dict, list[str]]:
    """The actor container and the arguments after `python -m actors`."""
    c = _container(_pod(objects, "Deployment", "distrl-actors"), "actor")
    argv = [*c.get("command", []), *c.get("args", [])]
    assert argv[:3] == ["python", "-m", "actors"], argv[:3]
    return c, _expand(argv[3:], _env(c))


def _mount(pod: dict, container: dict, volume_name: str) -> tuple[str, dict]:
    """(mountPath, volume) of a volume the container mounts."""
    (path,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume_name]
    (volume,) = [v for v in pod.get("volumes", []) if v["name"] == volume_name]
    return path, volume


def _secret_file(objects, pod: dict, container: dict, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at `path`, which must come from a Secret volume of the container."""
    for m in container["volumeMounts"]:
        directory = m["mountPath"].rstrip("/") + "/"
        if path.startswith(directory):
            _, volume = _mount(pod, container, m["name"])
            secret, key = volume["secret"]["secretName"], path[len(directory) :]
            assert key in objects[("Secret", secret)]["stringData"], (
                f"{path}: Secret {secret} has no key {key}"
            )
            assert m.get("readOnly") is True, f"{m['name']} should be mounted read-only"
            return secret, key
    raise AssertionError(f"{path} is on no volume of {container['name']}")


def _probe_script(probe: dict) -> str:
    assert set(probe) & {"tcpSocket", "httpGet", "grpc"} == set(), probe
    command = probe["exec"]["command"]
    assert command[:2] == ["sh", "-c"] and len(command) == 3, command
    return command[2]


# ---- the files -----------------------------------------------------------------------------------------


def test_every_manifest_parses_with_a_kind_its_api_version_and_a_valid_name(objects):
    kinds = sorted(kind for kind, _ in objects)
    assert kinds == sorted(
        ["Namespace", "Service", "Service", "StatefulSet", "Deployment"]
        + ["NetworkPolicy"] * 2
        + ["Secret"] * 3
    )
    (namespace,) = [name for kind, name in objects if kind == "Namespace"]
    for (kind, name), doc in objects.items():
        assert doc["apiVersion"] == API_VERSIONS[kind], (kind, name, doc["apiVersion"])
        assert DNS_LABEL.fullmatch(name), f"{kind} {name!r} is not a DNS-1123 label"
        if kind != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, (kind, name)
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "distrl-phone", (kind, name)


def test_every_command_word_is_a_string(objects):
    """Kubernetes refuses a number or a boolean in command/args (an unquoted 7555, or `on`)."""
    workloads = [
        (name, doc) for (kind, name), doc in objects.items() if kind in ("StatefulSet", "Deployment")
    ]
    assert len(workloads) == 2
    for name, doc in workloads:
        pod = doc["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            words = [*c.get("command", []), *c.get("args", [])]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                words += c.get(probe, {}).get("exec", {}).get("command", [])
            words += [e["value"] for e in c.get("env", [])]
            bad = [w for w in words if not isinstance(w, str)]
            assert not bad, f"{name}/{c['name']}: {bad}"


def test_kustomization_applies_every_manifest_but_the_secret_template():
    (k,) = _docs("kustomization.yaml")
    assert (k["apiVersion"], k["kind"]) == ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    assert sorted(k["resources"]) == [m for m in _manifests() if m != TEMPLATE]
    assert "namespace" not in k, "a kustomize namespace would move the objects but not the actors' --host"


# ---- the learner ---------------------------------------------------------------------------------------


def test_learner_is_one_stateful_pod_with_a_gpu(objects):
    sts = objects[("StatefulSet", "distrl-learner")]
    assert sts["spec"]["replicas"] == 1
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    governing = objects[("Service", sts["spec"]["serviceName"])]
    assert governing["spec"]["clusterIP"] == "None"
    c, _ = _learner(objects)
    resources = c["resources"]
    assert int(resources["limits"]["nvidia.com/gpu"]) == 1
    assert int(resources["requests"].get("nvidia.com/gpu", 1)) == 1  # extended resources: request == limit


def test_service_selects_the_learner_and_forwards_the_ports_it_binds(objects):
    c, argv = _learner(objects)
    labels = objects[("StatefulSet", "distrl-learner")]["spec"]["template"]["metadata"]["labels"]
    bound = {"ingest": int(_value(argv, "--ingest-port")), "params": int(_value(argv, "--params-port"))}
    container_ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert container_ports == {**bound, "metrics": int(_value(argv, "--metrics-port"))}
    assert all(p.get("protocol", "TCP") == "TCP" for p in c["ports"])
    for name in ("distrl-learner", "distrl-learner-pods"):
        spec = objects[("Service", name)]["spec"]
        assert spec["selector"].items() <= labels.items(), name
        for port in spec["ports"]:
            assert port["port"] == bound[port["name"]], (name, port)
            target = port.get("targetPort", port["port"])
            assert target in (port["name"], bound[port["name"]]), (name, port)
            if isinstance(target, str):
                assert container_ports[target] == bound[port["name"]]
        assert {p["name"] for p in spec["ports"]} == set(bound), name
    # ClusterIP: a virtual IP that outlives the learner pod, for the actors' reconnects
    assert objects[("Service", "distrl-learner")]["spec"].get("clusterIP") != "None"


def test_learner_ports_stay_clear_of_adb_and_the_emulators(objects):
    _, argv = _learner(objects)
    ports = [int(_value(argv, f)) for f in ("--ingest-port", "--params-port", "--metrics-port")]
    assert len(set(ports)) == 3
    for port in ports:
        assert port != 5037 and not 5554 <= port <= 5682, f"{port} is an adb or emulator port"


def test_run_dir_is_on_the_persistent_claim(objects):
    sts = objects[("StatefulSet", "distrl-learner")]
    c, argv = _learner(objects)
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    name = claim["metadata"]["name"]
    (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == name]
    pod_volumes = [v["name"] for v in sts["spec"]["template"]["spec"].get("volumes", [])]
    assert name not in pod_volumes, "a pod volume of the same name would replace the claim"
    run_dir = Path(_value(argv, "--run-dir"))
    assert run_dir.is_absolute() and Path(mount) in run_dir.parents, (run_dir, mount)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    assert "--checkpoint-every" not in argv or int(_value(argv, "--checkpoint-every")) > 0


def test_learner_probes_are_its_health_endpoints(objects):
    """Readiness and liveness are the learner's /readyz and /livez (learner/observe/status_http.py) on the port
    --metrics-port binds; Prometheus finds the same port through the pod's annotations."""
    sts = objects[("StatefulSet", "distrl-learner")]
    c, argv = _learner(objects)
    port = int(_value(argv, "--metrics-port"))
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        get = c[probe]["httpGet"]
        assert get["path"] == path and named[get["port"]] == port, (probe, get)
    assert c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"] >= 30
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port) and annotations["prometheus.io/path"] == "/metrics"
    assert Path(_env(c)["RUN_DIR"]) == Path(_value(argv, "--run-dir"))
    assert "command" not in c and c["args"][:3] == ["python", "-m", "learner"]  # SIGTERM reaches python
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60  # a checkpoint on SIGTERM


def test_learner_binds_every_interface_with_its_curve_keys(objects):
    pod = _pod(objects, "StatefulSet", "distrl-learner")
    c, argv = _learner(objects)
    assert _value(argv, "--bind") == "0.0.0.0"
    assert "--insecure" not in argv
    assert _secret_file(objects, pod, c, _value(argv, "--curve-secret-key")) == (
        "distrl-learner-key",
        "learner.key_secret",
    )
    path, volume = _mount(pod, c, "authorized")
    assert _value(argv, "--curve-authorized") == path
    authorized = objects[("Secret", volume["secret"]["secretName"])]
    assert authorized["stringData"] and all(k.endswith(".key") for k in authorized["stringData"])
    for v in pod["volumes"]:
        if "secret" in v:
            assert v["secret"]["defaultMode"] & 0o007 == 0, f"{v['name']}: key files readable by others"


# ---- the actors ----------------------------------------------------------------------------------------


def test_actor_dials_the_learner_service_by_its_dns_name(objects):
    _, actor = _actor(objects)
    _, learner = _learner(objects)
    service = objects[("Service", "distrl-learner")]
    namespace = service["metadata"]["namespace"]
    assert objects[("Deployment", "distrl-actors")]["metadata"]["namespace"] == namespace
    assert _value(actor, "--host") == f"{service['metadata']['name']}.{namespace}.svc"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert int(_value(actor, "--ingest-port")) == ports["ingest"] == int(_value(learner, "--ingest-port"))
    assert int(_value(actor, "--params-port")) == ports["params"] == int(_value(learner, "--params-port"))


def test_actor_keys_come_from_its_secret(objects):
    pod = _pod(objects, "Deployment", "distrl-actors")
    c, argv = _actor(objects)
    assert _secret_file(objects, pod, c, _value(argv, "--curve-secret-key")) == (
        "distrl-actor-key",
        "actor.key_secret",
    )
    assert _secret_file(objects, pod, c, _value(argv, "--curve-server-key")) == (
        "distrl-actor-key",
        "learner.key",
    )
    assert _env(c)["JAX_PLATFORMS"] == "cpu"
    learner_image = _learner(objects)[0]["image"]
    assert c["image"].rsplit(":", 1) == [learner_image.replace("-learner:", "-actor:").rsplit(":", 1)[0],
                                         learner_image.rsplit(":", 1)[1].removesuffix("-cuda")], (
        "learner and actors must run the same code: the same version of deploy/docker/Dockerfile's targets"
    )  # fmt: skip


def test_emulators_boot_on_kvm_beside_the_actor_that_drives_them(objects):
    pod = _pod(objects, "Deployment", "distrl-actors")
    _, argv = _actor(objects)
    assert _value(argv, "--env") == "adb"
    sidecars = pod["initContainers"]
    assert all(s.get("restartPolicy") == "Always" for s in sidecars), "native sidecars run beside the actor"
    assert sidecars[0]["name"] == "adb-server"
    server = shlex.join(sidecars[0]["command"])
    assert server == "adb -P 5037 server nodaemon" and " -a" not in server  # loopback of the pod only
    emulators = sidecars[1:]
    assert emulators and all(e["name"].startswith("emulator-") for e in emulators)
    serials = []
    for e in emulators:
        assert e["image"] == sidecars[0]["image"], "one adb version for the server and the probes"
        command = _expand(e["command"], _env(e))
        assert command[0] == "emulator" and "-avd" in command
        port = int(_value(command, "-port"))
        serial = f"emulator-{port}"
        assert e["name"] == serial
        assert port % 2 == 0 and 5554 <= port <= 5584, f"{port}: the adb server scans 5555-5585"
        serials.append(serial)
        for probe in ("startupProbe", "readinessProbe"):
            script = _probe_script(e[probe])
            assert f"adb -s {serial} shell getprop sys.boot_completed" in script, (serial, probe)
            assert script.rstrip().endswith("= 1 ]"), (serial, probe, script)
        assert e["startupProbe"]["periodSeconds"] * e["startupProbe"]["failureThreshold"] >= 300
        assert e["securityContext"]["privileged"] is True
        path, volume = _mount(pod, e, "kvm")
        assert path == "/dev/kvm"
        assert volume["hostPath"] == {"path": "/dev/kvm", "type": "CharDevice"}
    assert len(set(serials)) == len(serials)
    assert _values(argv, "--adb.serials") == serials
    cfg = tyro.cli(ActorConfig, args=argv)
    assert (cfg.adb.host, cfg.adb.port) == ("127.0.0.1", 5037)  # the adb-server sidecar, same pod
    # adbutils must not start an adb server of its own version beside the sidecar's
    assert _env(_container(pod, "actor"))["ADBUTILS_ADB_PATH"] == "/bin/false"


def test_network_policy_admits_the_actors_to_the_learner_ports_only(objects):
    learner_labels = objects[("StatefulSet", "distrl-learner")]["spec"]["template"]["metadata"]["labels"]
    actor_labels = objects[("Deployment", "distrl-actors")]["spec"]["template"]["metadata"]["labels"]
    _, argv = _learner(objects)
    policy = objects[("NetworkPolicy", "distrl-learner-ingress")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= learner_labels.items()
    assert not policy["podSelector"]["matchLabels"].items() <= actor_labels.items()
    rule, scrape = policy["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= actor_labels.items()
    assert sorted(p["port"] for p in rule["ports"]) == sorted(
        int(_value(argv, f)) for f in ("--ingest-port", "--params-port")
    )
    (monitoring,) = scrape["from"]
    assert set(monitoring) == {"namespaceSelector"}  # not the actors: /metrics has no authentication
    assert [p["port"] for p in scrape["ports"]] == [int(_value(argv, "--metrics-port"))]
    closed = objects[("NetworkPolicy", "distrl-actors-no-ingress")]["spec"]
    assert closed["podSelector"]["matchLabels"].items() <= actor_labels.items()
    assert closed["policyTypes"] == ["Ingress"] and closed["ingress"] == []


# ---- the Secrets ---------------------------------------------------------------------------------------


def test_secret_template_holds_no_key_and_its_commands_match_what_keys_writes(objects, tmp_path):
    text = (K8S / TEMPLATE).read_text()
    for path in K8S.iterdir():  # a CURVE certificate file's key line, anywhere in the folder
        assert not re.search(r'(public|secret)-key\s*=\s*"', path.read_text()), f"{path.name} holds a key"
    assert "python -m learner keys keys --actors 1" in text
    generate(tmp_path / "keys", 1)  # what `python -m learner keys keys --actors 1` writes
    shell = "\n".join(line.lstrip("#") for line in text.splitlines())  # the commands are in comments
    commands = re.findall(
        r"kubectl -n (\S+) create secret generic (\S+)((?:\s*\\?\s*--from-file=\S+)+)", shell
    )
    assert {name for _, name, _ in commands} == {n for k, n in objects if k == "Secret"}
    for namespace, name, sources in commands:
        secret = objects[("Secret", name)]
        assert namespace == secret["metadata"]["namespace"]
        keys = set()
        for source in re.findall(r"--from-file=(\S+)", sources):
            key, _, local = source.rpartition("=")
            local_path = tmp_path / local
            assert local_path.exists(), f"{name}: `python -m learner keys` writes no {local}"
            if local_path.is_dir():  # every file of the folder, by its name
                keys |= {p.name for p in local_path.iterdir()}
            else:
                keys.add(key or local_path.name)
        assert keys == set(secret["stringData"]), (name, keys)


def test_keys_mounted_from_secrets_are_accepted(tmp_path):
    """The kubelet mounts a Secret as KEY -> ..data/KEY symlinks beside a hidden ..data folder; the
    learner's authorized-keys folder and both key pairs work from such a layout."""
    keys = tmp_path / "keys"
    generate(keys, 1)

    def mount(files: dict[str, Path], at: Path) -> Path:
        stamp = at / "..2024_01_01_00_00_00.000000000"
        stamp.mkdir(parents=True)
        for key, source in files.items():
            (stamp / key).write_bytes(source.read_bytes())
        os.symlink(stamp.name, at / "..data")
        for key in files:
            os.symlink(f"..data/{key}", at / key)
        return at

    learner = mount({"learner.key_secret": keys / "learner.key_secret"}, tmp_path / "learner")
    authorized = mount({"actor-0.key": keys / "authorized" / "actor-0.key"}, tmp_path / "authorized")
    actor = mount(
        {"actor.key_secret": keys / "actor-0.key_secret", "learner.key": keys / "learner.key"},
        tmp_path / "actor",
    )
    server = CurveServer(learner / "learner.key_secret", authorized)
    client = CurveClient(actor / "actor.key_secret", actor / "learner.key")
    assert client.server_public == server.public
    assert list(zmq.auth.load_certificates(authorized)) == [client.public]


# ---- the CLI -------------------------------------------------------------------------------------------


def _help_flags(module: str) -> set[str]:
    """The flags `python -m MODULE --help` defines (option names only, not flags named in descriptions)."""
    env = {**os.environ, "COLUMNS": "80", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    flags = set()
    for line in out.stdout.splitlines():
        for cell in line.split("│"):
            if cell.startswith(" -"):
                flags.update(re.findall(r"--[\w.-]+", re.split(r"\s{2,}", cell.strip())[0]))
    assert {"--help", "--ingest-port", "--params-port"} <= flags, f"cannot read the {module} help"
    return flags


def test_every_flag_in_the_manifests_is_in_the_cli_help(objects):
    for module, argv in (("learner", _learner(objects)[1]), ("actors", _actor(objects)[1])):
        used = {w for w in argv if w.startswith("--")}
        unknown = used - _help_flags(module)
        assert not unknown, f"python -m {module} --help has no {sorted(unknown)}"


def test_the_manifest_commands_parse_with_the_cli(objects):
    learner = tyro.cli(LearnerConfig, args=_learner(objects)[1])  # its checks: ports, CURVE with --bind
    assert learner.transport.curve_secret_key is not None and not learner.transport.insecure
    assert learner.durability() == "fsync"  # what the claim is for: the log survives the pod
    actor = tyro.cli(ActorConfig, args=_actor(objects)[1])
    assert actor.env == "adb" and actor.curve_secret_key and actor.curve_server_key
    assert (actor.ingest_port, actor.params_port) == (
        learner.transport.ingest_port,
        learner.transport.params_port,
    )
