"""Authentication in the cluster files: every server, worker and job container takes its credentials from a Secret
(by name and key that secrets.example.yaml defines), no Secret value is written anywhere else, MLflow runs its
basic-auth app with the user database on the PostgreSQL beside the tracking store, the flow-run pods get the
`pipeline` identity and the Prefect auth string from Secrets (the worker's copy is dropped), and the
NetworkPolicies admit only the codemill namespace's workers and the UI ingress to MLflow and Prefect, and only
the two servers to PostgreSQL. Nothing here needs a cluster."""
from __future__ import annotations

import configparser
import copy
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from codemill.lineage import IDENTITY_GRANTS, PIPELINE_USER, READER_USER
from tests.unit.test_deploy_manifests import DEPLOY, MANIFESTS, SECRETS, _rendered_job, _template, load_objects

CREDENTIAL = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH[_-]STRING|ACCESS_KEY|_KEY$|USERNAME|^PGUSER$", re.I)
USERINFO = re.compile(r"://[^/\s@]+@")  # user[:password]@ in a URI
WORKLOADS = {"Deployment", "StatefulSet", "Job"}


def secrets() -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o["stringData"] for o in load_objects(SECRETS) if o["kind"] == "Secret"}


def secret_values() -> set[str]:
    """The values that are credentials (not the user or database names): none may appear outside the Secrets."""
    return {v for data in secrets().values() for k, v in data.items() if CREDENTIAL.search(k) and
            not k.upper().endswith(("USERNAME", "_USER"))}


def pod_specs(obj: dict) -> list[dict]:
    if obj.get("kind") not in WORKLOADS:
        return []
    return [obj["spec"]["template"]["spec"]]


def containers(obj: dict) -> list[dict]:
    return [c for spec in pod_specs(obj) for c in [*spec.get("initContainers", []), *spec["containers"]]]


def secret_refs(container: dict) -> set[tuple[str, str | None]]:
    """(Secret, key) pairs a container reads; key None for a whole Secret through envFrom."""
    refs: set[tuple[str, str | None]] = set()
    for env in container.get("env", []):
        if ref := env.get("valueFrom", {}).get("secretKeyRef"):
            refs.add((ref["name"], ref["key"]))
    for src in container.get("envFrom", []):
        if ref := src.get("secretRef"):
            refs.add((ref["name"], None))
    return refs


def credential_errors(obj: dict, where: str = "") -> list[str]:
    """Every credential of `obj` that does not come from a Secret, or a Secret value written into it."""
    where = where or f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    errors = []
    if obj.get("kind") == "Secret":
        return [f"{where}: a Secret outside {SECRETS.name}"]
    text = json.dumps(obj)
    errors += [f"{where}: inlines a Secret value {v!r}" for v in sorted(secret_values()) if v in text]
    errors += [f"{where}: a URI with credentials: {m.group(0)}" for m in USERINFO.finditer(text)]
    for c in containers(obj):
        for env in c.get("env", []):
            if CREDENTIAL.search(env["name"]) and "secretKeyRef" not in (env.get("valueFrom") or {}):
                errors.append(f"{where}/{c['name']}: {env['name']} not from a secretKeyRef")
        for arg in [*c.get("command", []), *c.get("args", [])]:
            if any(CREDENTIAL.search(v) for v in re.findall(r"\$\((\w+)\)", arg)):
                errors.append(f"{where}/{c['name']}: a credential expanded into the command line: {arg}")
        for name, key in secret_refs(c):
            if name not in secrets() or (key is not None and key not in secrets()[name]):
                errors.append(f"{where}/{c['name']}: no Secret {name}{f' key {key}' if key else ''} in {SECRETS.name}")
    if obj.get("kind") == "ConfigMap":
        for key, value in obj.get("data", {}).items():
            if re.search(r"^\s*\w*(password|secret)\w*\s*[=:]", value, re.I | re.M):
                errors.append(f"{where}: {key} sets a credential")
    return errors


def all_objects() -> list[tuple[str, dict]]:
    return [(p.relative_to(DEPLOY).as_posix(), o) for p in MANIFESTS if p != SECRETS for o in load_objects(p)]


def find(kind: str, name: str) -> dict:
    return next(o for _, o in all_objects() if o["kind"] == kind and o["metadata"]["name"] == name)


def container(kind: str, name: str) -> dict:
    return containers(find(kind, name))[0]


# What each server, worker and job container must read from which Secret (and key).
REQUIRED = {
    ("Deployment", "mlflow"): {("mlflow-auth", "admin-username"), ("mlflow-auth", "admin-password"),
                               ("mlflow-auth", "flask-secret-key"), ("mlflow-postgres", "POSTGRES_USER"),
                               ("mlflow-postgres", "POSTGRES_PASSWORD"), ("codemill-s3", None)},
    ("StatefulSet", "mlflow-postgres"): {("mlflow-postgres", None)},
    ("Deployment", "prefect-server"): {("prefect-api-auth", "auth-string"), ("mlflow-postgres", "POSTGRES_USER"),
                                       ("mlflow-postgres", "POSTGRES_PASSWORD")},
    ("Deployment", "prefect-worker"): {("prefect-api-auth", "auth-string")},
    ("Job", "mlflow-identities"): {("mlflow-auth", "admin-username"), ("mlflow-auth", "admin-password"),
                                   ("mlflow-pipeline", "MLFLOW_TRACKING_PASSWORD"),
                                   ("mlflow-reader", "MLFLOW_TRACKING_PASSWORD")},
    ("Job", "codemill-train"): {("mlflow-pipeline", None)},
}


@pytest.mark.parametrize("kind, name", list(REQUIRED), ids=lambda v: str(v))
def test_every_server_container_takes_its_credentials_from_a_secret(kind, name):
    assert secret_refs(container(kind, name)) >= REQUIRED[(kind, name)]


def test_no_secret_value_is_inlined_anywhere():
    assert secret_values() >= {"CHANGE_ME", "codemill:CHANGE_ME"}
    workloads = [(f, o) for f, o in all_objects() if o["kind"] in WORKLOADS]
    assert {(o["kind"], o["metadata"]["name"]) for _, o in workloads} >= set(REQUIRED)
    errors = [e for f, o in all_objects() for e in credential_errors(o, f"{f}:{o['kind']}/{o['metadata']['name']}")]
    errors += credential_errors(_template(), "base-job-template.json")
    for path in (DEPLOY / "prefect.yaml", DEPLOY / "Dockerfile"):
        errors += [f"{path.name}: inlines {v!r}" for v in secret_values() if v in path.read_text()]
    assert not errors, "\n".join(errors)


def test_checker_catches_inlined_credentials():
    mlflow = find("Deployment", "mlflow")
    assert credential_errors(mlflow) == []
    inlined = copy.deepcopy(mlflow)
    env = containers(inlined)[0]["env"]
    env[[e["name"] for e in env].index("PGPASSWORD")] = {"name": "PGPASSWORD", "value": "hunter2hunter2"}
    assert credential_errors(inlined) == ["Deployment/mlflow/mlflow: PGPASSWORD not from a secretKeyRef"]
    in_uri = copy.deepcopy(mlflow)
    containers(in_uri)[0]["args"].append("--backend-store-uri=postgresql://mlflow:$(PGPASSWORD)@mlflow-postgres/m")
    assert len(credential_errors(in_uri)) == 2  # the user:password@ URI, the password expanded into args
    leaked = copy.deepcopy(find("ConfigMap", "mlflow-auth"))
    leaked["data"]["basic_auth.ini"] += "admin_password = CHANGE_ME\n"
    assert credential_errors(leaked) == ["ConfigMap/mlflow-auth: inlines a Secret value 'CHANGE_ME'",
                                         "ConfigMap/mlflow-auth: basic_auth.ini sets a credential"]
    dangling = copy.deepcopy(mlflow)
    containers(dangling)[0]["envFrom"].append({"secretRef": {"name": "mlflow-typo"}})
    assert credential_errors(dangling) == [f"Deployment/mlflow/mlflow: no Secret mlflow-typo in {SECRETS.name}"]


def test_mlflow_runs_basic_auth_with_its_user_db_on_the_tracking_postgres():
    c = container("Deployment", "mlflow")
    assert "--app-name=basic-auth" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    ini_path = Path(env["MLFLOW_AUTH_CONFIG_PATH"]["value"])
    mount = next(m for m in c["volumeMounts"] if ini_path.parent == Path(m["mountPath"]))
    volume = next(v for v in find("Deployment", "mlflow")["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == mount["name"])
    config_map = find("ConfigMap", volume["configMap"]["name"])
    ini = configparser.ConfigParser()
    ini.read_string(config_map["data"][ini_path.name])
    auth = ini["mlflow"]
    assert auth["default_permission"] == "NO_PERMISSIONS"  # anonymous and unknown users get nothing
    assert "admin_password" not in auth  # the bootstrap password is MLFLOW_AUTH_ADMIN_PASSWORD, from the Secret
    auth_db = urlsplit(auth["database_uri"])
    tracking_db = urlsplit(next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--backend-store-uri=")))
    postgres = find("Service", "mlflow-postgres")
    port = postgres["spec"]["ports"][0]["port"]
    assert auth_db.scheme == tracking_db.scheme == "postgresql"
    assert auth_db.hostname == tracking_db.hostname == postgres["metadata"]["name"]
    assert auth_db.port == tracking_db.port == port
    assert auth_db.username is None and tracking_db.username is None  # libpq reads PGUSER / PGPASSWORD
    assert auth_db.path != tracking_db.path
    init = "\n".join(find("ConfigMap", "mlflow-postgres-init")["data"].values())
    created = set(re.findall(r"CREATE DATABASE (\w+);", init))
    prefect_db = {e["name"]: e.get("value") for e in container("Deployment", "prefect-server")["env"]}
    assert created == {auth_db.path.lstrip("/"), prefect_db["PREFECT_SERVER_DATABASE_NAME"]}
    assert tracking_db.path.lstrip("/") == secrets()["mlflow-postgres"]["POSTGRES_DB"]
    assert prefect_db["PREFECT_SERVER_DATABASE_HOST"] == postgres["metadata"]["name"]


def test_identity_secrets_match_the_identities_codemill_creates():
    assert secrets()["mlflow-pipeline"]["MLFLOW_TRACKING_USERNAME"] == PIPELINE_USER
    assert secrets()["mlflow-reader"]["MLFLOW_TRACKING_USERNAME"] == READER_USER
    assert IDENTITY_GRANTS == {PIPELINE_USER: "EDIT", READER_USER: "READ"}
    job = container("Job", "mlflow-identities")
    assert job["command"] == ["codemill", "mlflow-identities"]


def _prepared_env(job_env: dict[str, Any], auth_string: str) -> dict[str, str | None]:
    """The env Prefect's worker gives a flow run's container: its own settings, then the template's env."""
    from uuid import uuid4

    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings
    from prefect.workers.base import BaseJobConfiguration

    config = BaseJobConfiguration(command="prefect flow-run execute", env=job_env)
    with temporary_settings({PREFECT_API_AUTH_STRING: auth_string}):
        config.prepare_for_flow_run(FlowRun(flow_id=uuid4(), name="nightly"))
    return config.env


def test_flow_run_pods_get_the_pipeline_identity_and_prefect_auth_from_secrets():
    config = _rendered_job(_template())
    pod = config["job_manifest"]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert {"secretRef": {"name": "mlflow-pipeline"}} in c["envFrom"]  # not optional: no anonymous flow runs
    assert set(secrets()["mlflow-pipeline"]) == {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
    assert {"name": "PREFECT_API_AUTH_STRING",
            "valueFrom": {"secretKeyRef": {"name": "prefect-api-auth", "key": "auth-string"}}} in c["env"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "flow-run"
    # The worker passes its own settings to the Job as plain env values: the template's null drops the auth string
    # so the Job object never holds it; the pod reads it from the Secret above.
    env = _prepared_env(config["env"], "codemill:worker-secret")
    assert "PREFECT_API_AUTH_STRING" not in env and "worker-secret" not in json.dumps(env)
    without_null = {k: v for k, v in config["env"].items() if k != "PREFECT_API_AUTH_STRING"}
    assert _prepared_env(without_null, "codemill:worker-secret")["PREFECT_API_AUTH_STRING"] == \
        "codemill:worker-secret"


# --- NetworkPolicy ------------------------------------------------------------------------------------------
NAMESPACE = "codemill"


def _matches(selector: dict, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def admitted(policies: list[dict], target: dict[str, str], source_ns: str, source: dict[str, str],
             port: int) -> bool:
    """Whether a pod (namespace, labels) may connect to `target` (labels, in the codemill namespace) on `port`,
    under the rules of NetworkPolicy: a selected pod takes only what some ingress rule of a policy admits."""
    selecting = [p for p in policies if _matches(p["spec"]["podSelector"], target)]
    if not selecting:
        return True
    ns_labels = {"kubernetes.io/metadata.name": source_ns}
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            for peer in rule.get("from", []):
                ns_ok = (_matches(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer
                         else source_ns == NAMESPACE)
                pod_ok = _matches(peer["podSelector"], source) if "podSelector" in peer else True
                if ns_ok and pod_ok:
                    return True
    return False


def _pod_labels() -> dict[str, dict[str, str]]:
    labels = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
              for _, o in all_objects() if o["kind"] in WORKLOADS}
    labels["flow-run"] = _rendered_job(_template())["job_manifest"]["spec"]["template"]["metadata"]["labels"]
    return labels


def test_network_policies_admit_only_workers_and_the_ui_ingress():
    policies = [o for f, o in all_objects() if o["kind"] == "NetworkPolicy"]
    pods = _pod_labels()
    servers = {"mlflow": 5000, "prefect-server": 4200, "mlflow-postgres": 5432}
    for server in servers:  # each server is isolated by exactly one policy
        assert len([p for p in policies if _matches(p["spec"]["podSelector"], pods[server])]) == 1, server
    sources = {name: (NAMESPACE, labels) for name, labels in pods.items()}
    sources |= {"ui-ingress": ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
                "unlabelled pod": (NAMESPACE, {"app": "debug"}),
                "flow-run lookalike elsewhere": ("default", pods["flow-run"]),
                "other namespace": ("default", {})}
    expected = {
        "mlflow": {"prefect-worker", "flow-run", "codemill-train", "mlflow-identities", "ui-ingress"},
        "prefect-server": {"prefect-worker", "flow-run", "ui-ingress"},
        "mlflow-postgres": {"mlflow", "prefect-server"},
    }
    for server, port in servers.items():
        allowed = {name for name, (ns, labels) in sources.items() if name != server and
                   admitted(policies, pods[server], ns, labels, port)}
        assert allowed == expected[server], server
    assert not admitted(policies, pods["mlflow"], NAMESPACE, pods["prefect-worker"], 22)  # the port counts too


def test_policy_checker_can_refuse_and_admit():
    policy = {"spec": {"podSelector": {"matchLabels": {"app": "x"}}, "ingress": [
        {"from": [{"podSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["a"]}]}}],
         "ports": [{"port": 1}]}]}}
    assert admitted([policy], {"app": "x"}, NAMESPACE, {"role": "a"}, 1)
    assert not admitted([policy], {"app": "x"}, NAMESPACE, {"role": "b"}, 1)
    assert not admitted([policy], {"app": "x"}, "other", {"role": "a"}, 1)
    assert admitted([policy], {"app": "y"}, "other", {}, 9)  # not selected: open
