"""The Kubernetes manifest: valid for the operator, and true to how the package behaves there."""

import copy
import json
import os

import jsonschema
import pytest
import yaml

from cifar10_estimator.config import flags
from trainer_fixtures import REPO

MANIFEST = os.path.join(REPO, "k8s", "tfjob.yaml")
SCHEMA = os.path.join(REPO, "k8s", "tfjob.schema.json")
# Every manifest: a TFJob, and the resources that go with it (a volume claim, a NetworkPolicy).
MANIFESTS = [os.path.join(REPO, "k8s", name)
             for name in ("tfjob.yaml", "tfjob-allreduce.yaml", "tfjob-s3.yaml")]


def _documents(path: str) -> list[dict]:
    """The documents of a multi-document YAML file, empty ones left out."""
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


@pytest.fixture(scope="module")
def tfjob() -> dict:
    jobs = [d for d in _documents(MANIFEST) if d.get("kind") == "TFJob"]
    assert len(jobs) == 1
    return jobs[0]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    with open(SCHEMA) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_manifest_is_a_valid_tfjob(tfjob, validator):
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(tfjob)]
    assert not errors, errors


@pytest.mark.parametrize("path,value", [
    (("spec", "runPolicy", "cleanPodPolicy"), "Sometimes"),
    (("spec", "tfReplicaSpecs", "PS", "restartPolicy"), "OnExit"),
    (("spec", "runPolicy", "cleanPodPolicyy"), "None"),  # a misspelt key
    (("spec", "tfReplicaSpecs", "Evaluater"), {"template": {"spec": {"containers": []}}}),
])
def test_the_schema_refuses_what_the_operator_would_not_take(tfjob, validator, path, value):
    broken = copy.deepcopy(tfjob)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert list(validator.iter_errors(broken))


def test_the_job_ends_the_way_the_package_needs(tfjob):
    run_policy = tfjob["spec"]["runPolicy"]
    # Running would delete the evaluator during its final evaluation once the chief succeeds.
    assert run_policy["cleanPodPolicy"] == "None"
    assert "backoffLimit" not in run_policy  # not applied to ExitCode restarts (#2045)
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker", "PS", "Evaluator"}
    for name, spec in specs.items():
        # Signals (>= 128) restart the pod; our user errors (2) and lost-ps exits (1) fail
        # the job instead of looping.
        assert spec["restartPolicy"] == "ExitCode", name


def _container(spec: dict) -> dict:
    return next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow")


def test_every_replica_runs_the_trainer_with_flags_it_accepts(tfjob):
    specs = tfjob["spec"]["tfReplicaSpecs"]
    parser = flags.build_parser()
    trainer_args = None
    for name, spec in specs.items():
        container = _container(spec)
        assert container["command"] == ["python", "-m", "cifar10_estimator"], name
        args = parser.parse_args(container["args"])  # exits on an unknown or bad flag
        if name == "PS":
            assert args.data_dir is None and args.job_dir is None  # a ps needs no data
            continue
        # Trainers and the evaluator share data, job dir and model flags, and the volume.
        if trainer_args is None:
            trainer_args = container["args"]
        assert container["args"] == trainer_args, name
        assert args.job_dir.startswith("/shared/") and args.data_dir.startswith("/shared/")
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/shared" in mounts, name
        assert 2222 in [p["containerPort"] for p in container.get("ports", [])] or \
            name == "Evaluator", name


# The operator's own TFJob CRD (kubeflow/training-operator v1.9.0), where it is provided:
# ../shared/k8s/ beside the clone (CI has it; a user's fresh clone does not).
OPERATOR_CRD = os.path.join(os.path.dirname(REPO), "shared", "k8s", "kubeflow.org_tfjobs.yaml")


@pytest.mark.skipif(not os.path.isfile(OPERATOR_CRD),
                    reason=f"the operator's CRD is not at {OPERATOR_CRD}")
def test_the_manifest_passes_the_operators_own_schema(tfjob):
    with open(OPERATOR_CRD) as f:
        crd = yaml.safe_load(f)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    # An OpenAPI v3 schema: JSON Schema's keywords, plus x-kubernetes-* ones jsonschema ignores.
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(tfjob)]
    assert not errors, errors
    # And it refuses what the API server would: a replica count that is no integer.
    broken = copy.deepcopy(tfjob)
    broken["spec"]["tfReplicaSpecs"]["PS"]["replicas"] = "two"
    assert list(validator.iter_errors(broken))


def test_the_dockerfile_builds_the_image_the_manifest_runs(tfjob):
    with open(os.path.join(REPO, "Dockerfile")) as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    # Python 3.11: the default pair, and the only Python the s3 extra's TensorFlow 2.15 has.
    assert lines[0].startswith("FROM python:3.11")
    assert "COPY cifar10_estimator ./cifar10_estimator" in lines
    # The estimator layer, a distribution of its own in the repository, installed with it.
    assert "COPY tf-estimator-compat ./tf-estimator-compat" in lines
    # The s3 extra on request (k8s/tfjob-s3.yaml's replicas read and write a bucket).
    assert 'ARG EXTRAS=""' in lines
    assert ('RUN pip install --no-cache-dir ./tf-estimator-compat ".${EXTRAS}" && rm -rf /src'
            in lines)
    for spec in tfjob["spec"]["tfReplicaSpecs"].values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["command"] == ["python", "-m", "cifar10_estimator"]


S3_MANIFEST = os.path.join(REPO, "k8s", "tfjob-s3.yaml")


def test_the_s3_variant_keeps_the_job_in_a_bucket_with_credentials_from_a_secret(validator):
    documents = _documents(S3_MANIFEST)
    assert [d["kind"] for d in documents] == ["TFJob", "NetworkPolicy"]  # no volume claim
    job = documents[0]
    validator.validate(job)
    if os.path.isfile(OPERATOR_CRD):
        with open(OPERATOR_CRD) as f:
            crd = yaml.safe_load(f)
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"]).validate(job)
    parser = flags.build_parser()
    for name, spec in job["spec"]["tfReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        assert "volumes" not in pod, name
        (container,) = pod["containers"]
        assert "volumeMounts" not in container, name
        args = parser.parse_args(container["args"])
        if name == "PS":
            continue  # a ps reads and writes nothing
        assert args.job_dir.startswith("s3://") and args.data_dir.startswith("s3://"), name
        env = {e["name"]: e for e in container["env"]}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "cifar10-s3", "key": key}
        assert "AWS_REGION" in env


# The labels Kubeflow's training operator gives every pod of a TFJob (release 1.9: GenLabels,
# the job's and the controller's names, then the replica's type, lowercased, and index).
def _pod_labels(job_name: str, replica_type: str, index: int) -> dict:
    return {"training.kubeflow.org/job-name": job_name,
            "training.kubeflow.org/operator-name": "tfjob-controller",
            "training.kubeflow.org/replica-type": replica_type.lower(),
            "training.kubeflow.org/replica-index": str(index)}


def _selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector of matchLabels alone selects a pod with ``labels``."""
    assert set(selector) == {"matchLabels"}, selector  # no matchExpressions to evaluate
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_a_network_policy_admits_only_the_jobs_own_pods_to_the_task_port(path):
    # TensorFlow's gRPC server listens on every interface and has no authentication.
    documents = _documents(path)
    (job,) = [d for d in documents if d["kind"] == "TFJob"]
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["metadata"].get("namespace") == job["metadata"].get("namespace")
    spec = policy["spec"]
    assert set(spec) <= {"podSelector", "policyTypes", "ingress", "egress"}
    name, replicas = job["metadata"]["name"], job["spec"]["tfReplicaSpecs"]
    pods = [_pod_labels(name, kind, i) for kind, replica in replicas.items()
            for i in range(replica["replicas"])]
    strangers = [_pod_labels("another-job", "Chief", 0), _pod_labels("another-job", "Worker", 1),
                 {"training.kubeflow.org/job-name": name}, {}]  # not the operator's, or none
    # The policy covers every pod of the job, and no other pod.
    assert all(_selects(spec["podSelector"], pod) for pod in pods)
    assert not any(_selects(spec["podSelector"], pod) for pod in strangers)
    # It restricts what comes in; what goes out (S3, DNS, the volume's server) stays open.
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    # A pod selector alone: pods of the policy's own namespace, no namespaceSelector or ipBlock.
    assert set(peer) == {"podSelector"}
    assert all(_selects(peer["podSelector"], pod) for pod in pods)
    assert not any(_selects(peer["podSelector"], pod) for pod in strangers)
    # Only the task port, the one every serving replica declares.
    ports = {port["containerPort"] for replica in replicas.values()
             for container in replica["template"]["spec"]["containers"]
             for port in container.get("ports", [])}
    assert ports == {2222}
    assert rule["ports"] == [{"protocol": "TCP", "port": 2222}]
