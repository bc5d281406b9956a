"""The Helm chart deploy/helm/rl-orchestrator renders a valid KubeRay RayJob for a GRPO run.

Rendering is offline, through Helm v4's own library (PyPI `helm-python-sdk`): values.schema.json, the
templates and `helm lint` behave as with the `helm` binary. Core objects are checked by
`kubernetes-validate` in strict mode (unknown fields fail), the RayJob against the openAPIV3Schema of
KubeRay's CRD (tests/deploy/data, unknown fields fail too), and the run config the entrypoint reads is
loaded with `orchestrator.config.load_config`.

    pytest tests/deploy -q
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from orchestrator.config import load_config

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "rl-orchestrator"
EXAMPLE_7B = CHART / "values-7b-2x8gpu.yaml"
RAYJOB_CRD = Path(__file__).parent / "data" / "ray.io_rayjobs.yaml"
KUBE_VERSION = "1.35.0"
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# ---------------------------------------------------------------------------------------------------
# Rendering and validation helpers
# ---------------------------------------------------------------------------------------------------

def render(values: dict | None = None, *, name: str = "demo", namespace: str = "rl") -> list[dict]:
    """`helm template` of the chart: the rendered objects (multi-document output split, NOTES dropped).
    Raises helm.HelmValuesError (schema) or helm.HelmRenderError (a template's `fail`)."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values or {}, name=name, namespace=namespace)
    return [doc for path, text in sorted(manifests.items()) if path.endswith((".yaml", ".yml"))
            for doc in yaml.safe_load_all(text) if doc]


def values_file(path: Path) -> dict:
    """A values file parsed by Helm's own YAML reader (as `helm -f path` reads it)."""
    return helm.values_from_yaml(path.read_text())


def one(objects: list[dict], kind: str, suffix: str = "") -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"expected one {kind} named *{suffix}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def _strict(schema):
    """A CRD structural schema as a JSON schema that rejects unknown fields (like `kubectl apply` with
    strict field validation, where the API server would otherwise prune them). x-kubernetes-int-or-string
    becomes integer|string, nullable adds null, x-kubernetes-preserve-unknown-fields keeps an object open.
    CEL rules (x-kubernetes-validations) are not evaluated."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: _strict(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = _strict(out[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [_strict(s) for s in out[key]]
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _list_map_keys(validator, keys, instance, schema):
    """x-kubernetes-list-map-keys: no two items of the list share their key fields (ports, env, ...)."""
    if not validator.is_type(instance, "array"):
        return
    seen = set()
    for item in instance:
        key = tuple(str(item.get(k)) for k in keys) if isinstance(item, dict) else (str(item),)
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry with {dict(zip(keys, key))}")
        seen.add(key)


FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("int32")(lambda v: not isinstance(v, int) or -(2**31) <= v < 2**31)
FORMATS.checks("int64")(lambda v: not isinstance(v, int) or -(2**63) <= v < 2**63)
CrdValidator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"x-kubernetes-list-map-keys": _list_map_keys})


@pytest.fixture(scope="module")
def rayjob_validator():
    crd = yaml.load(RAYJOB_CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return CrdValidator(_strict(version["schema"]["openAPIV3Schema"]), format_checker=FORMATS)


def _path(error: jsonschema.ValidationError) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".") or "<root>"


def rayjob_errors(validator, rayjob: dict) -> list[str]:
    """Every violation of the CRD schema and of KubeRay's name rule, each naming its field path."""
    errors = [f"{_path(e)}: {e.message}" for e in validator.iter_errors(rayjob)]
    name = rayjob["metadata"]["name"]
    if len(name) > 47 or not DNS1035_LABEL.match(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label of at most 47 characters (KubeRay)")
    return sorted(errors)


def pod_templates(rayjob: dict) -> dict[str, dict]:
    spec = rayjob["spec"]["rayClusterSpec"]
    groups = {"head": spec["headGroupSpec"]["template"]}
    groups.update({g["groupName"]: g["template"] for g in spec["workerGroupSpecs"]})
    return groups


def validate_all(objects: list[dict], validator) -> None:
    """Core kinds (and the RayJob's pod templates, as PodTemplates) strictly with kubernetes-validate,
    the RayJob with the CRD schema; every object name is a DNS-1123 label of at most 63 characters."""
    problems = []
    for obj in objects:
        name = obj["metadata"]["name"]
        if len(name) > 63 or not DNS1123_LABEL.match(name):
            problems.append(f"{obj['kind']} {name!r}: not a DNS-1123 label of at most 63 characters")
        if obj["apiVersion"] == "ray.io/v1":
            assert obj["kind"] == "RayJob"
            problems += [f"RayJob {name}: {e}" for e in rayjob_errors(validator, obj)]
            checked = [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-{group}"},
                        "template": template} for group, template in pod_templates(obj).items()]
        else:
            checked = [obj]
        for o in checked:
            try:
                kubernetes_validate.validate(o, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                problems.append(f"{o['kind']} {o['metadata']['name']}: {path}: {e.message}")
    assert not problems, "\n".join(problems)


def ray_container(template: dict) -> dict:
    return template["spec"]["containers"][0]


def run_config_and_argv(objects: list[dict], tmp_path: Path) -> tuple[Path, list[str]]:
    """The ConfigMap's run.yaml written where the entrypoint reads it (under tmp_path), and the
    entrypoint's arguments after the config path. Checks that the head mounts that ConfigMap there."""
    rayjob = one(objects, "RayJob")
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert argv[1:3] == ["-m", "orchestrator"], argv
    config_path = Path(argv[3])
    head = pod_templates(rayjob)["head"]
    mount = next(m for m in ray_container(head)["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in head["spec"]["volumes"] if v["name"] == mount["name"])
    configmap = one(objects, "ConfigMap", "-config")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    local = tmp_path / config_path.name
    local.write_text(configmap["data"][config_path.name])
    return local, argv[4:]


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------

def test_default_values_render_valid_objects(rayjob_validator):
    objects = render()
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "ConfigMap", "PersistentVolumeClaim", "RayJob"]
    validate_all(objects, rayjob_validator)
    rayjob = one(objects, "RayJob")
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    assert rayjob["spec"]["ttlSecondsAfterFinished"] == 600
    claim = one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    for group, template in pod_templates(rayjob).items():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == claim, group
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and volumes["dshm"]["emptyDir"]["sizeLimit"]
        mounts = {m["mountPath"]: m["name"] for m in ray_container(template)["volumeMounts"]}
        assert mounts["/dev/shm"] == "dshm" and mounts["/shared"] == "shared"


def test_7b_example_renders_two_nodes_of_eight_gpus(rayjob_validator):
    objects = render(values_file(EXAMPLE_7B), name="grpo-7b")
    validate_all(objects, rayjob_validator)
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]  # shared.existingClaim is used
    rayjob = one(objects, "RayJob")
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    assert group["rayStartParams"]["num-gpus"] == "8"
    worker = group["template"]
    assert ray_container(worker)["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert worker["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert worker["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "podAntiAffinity" in worker["spec"]["affinity"]
    for template in pod_templates(rayjob).values():
        env = {e["name"]: e.get("value") for e in ray_container(template)["env"]}
        assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_HCA"] == "mlx5"
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "rl-shared"
        assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "models"


def test_changed_values_reach_the_rendered_objects(rayjob_validator):
    objects = render({
        "image": {"repository": "registry.example.com/rl/orch", "tag": "v9", "pullPolicy": "Always"},
        "worker": {"replicas": 3, "gpus": 4, "nodeSelector": {"gpu": "a100"},
                   "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}]},
        "env": {"NCCL_SOCKET_IFNAME": "ib0", "RAY_AUTH_MODE": "token"},
        "shared": {"existingClaim": "team-shared"},
        "job": {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0},
    })
    validate_all(objects, rayjob_validator)
    rayjob = one(objects, "RayJob")
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is False
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    assert group["rayStartParams"]["num-gpus"] == "4"
    resources = ray_container(group["template"])["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 4
    assert group["template"]["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert group["template"]["spec"]["tolerations"][0]["key"] == "dedicated"
    for template in pod_templates(rayjob).values():
        container = ray_container(template)
        assert container["image"] == "registry.example.com/rl/orch:v9"
        assert container["imagePullPolicy"] == "Always"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["NCCL_SOCKET_IFNAME"] == "ib0" and env["RAY_AUTH_MODE"] == "token"
        claims = [v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"] if v["name"] == "shared"]
        assert claims == ["team-shared"]


@pytest.mark.parametrize("values, field", [
    ({"worker": {"replicas": "two"}}, "/worker/replicas"),
    ({"worker": {"replicas": 0}}, "/worker/replicas"),
    ({"worker": {"gpus": -1}}, "/worker/gpus"),
    ({"image": {"repository": ""}}, "/image/repository"),
    ({"image": {"repository": None}}, "repository"),
    ({"worker": {"replica": 2}}, "replica"),
    ({"head": {"shmSizeLimit": "lots"}}, "/head/shmSizeLimit"),
    ({"paths": {"outputDir": "runs/x"}}, "/paths/outputDir"),
    ({"worker": {"rayStartParams": {"num-cpus": 8}}}, "/worker/rayStartParams/num-cpus"),
])
def test_broken_values_fail_naming_the_field(values, field):
    with pytest.raises(helm.HelmValuesError) as info:
        render(values)
    assert field in str(info.value), str(info.value)


def test_template_checks_fail_with_a_readable_message():
    with pytest.raises(helm.HelmRenderError, match=r'orchestrator\.config\.rollout has a key "false"'):
        render({"orchestrator": {"config": {"rollout": {"false": 8}}}})  # what `n: 8` becomes in YAML 1.1
    with pytest.raises(helm.HelmRenderError, match="DNS-1035"):
        render({"fullnameOverride": "7b-run"})


def test_crd_validation_names_the_field(rayjob_validator):
    """The CRD check is not vacuous: a wrong type, an unknown field and a duplicate port are reported
    with their paths."""
    rayjob = one(render(), "RayJob")
    group = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    group["replicas"] = "two"
    group["template"]["spec"]["containers"][0]["gpus"] = 8
    group["template"]["spec"]["containers"][0]["ports"].append({"name": "again", "containerPort": 8080})
    errors = "\n".join(rayjob_errors(rayjob_validator, rayjob))
    assert "spec.rayClusterSpec.workerGroupSpecs[0].replicas: 'two' is not of type 'integer'" in errors
    assert "workerGroupSpecs[0].template.spec.containers[0]: Additional properties are not allowed ('gpus'" in errors
    assert "containers[0].ports: duplicate entry" in errors


@pytest.mark.parametrize("values_path", [None, EXAMPLE_7B], ids=["default", "7b-2x8gpu"])
def test_entrypoint_config_loads(values_path, tmp_path):
    values = values_file(values_path) if values_path else {}
    values.setdefault("orchestrator", {})["overrides"] = ["trainer.total_steps=20", "data.system_prompt=It's 'fine'"]
    values["orchestrator"].setdefault("config", {}).setdefault("data", {})["seed"] = 123456789  # no 1.23e+08
    objects = render(values)
    config_file, overrides = run_config_and_argv(objects, tmp_path)
    assert overrides == ["trainer.total_steps=20", "data.system_prompt=It's 'fine'"]
    cfg = load_config(config_file, overrides)
    assert cfg.trainer.total_steps == 20 and cfg.data.system_prompt == "It's 'fine'"
    out = f"/shared/runs/{cfg.run.name}"
    assert (cfg.run.output_dir, cfg.checkpoint.dir, cfg.weight_sync.disk.path) == (
        out, f"{out}/checkpoints", f"{out}/weight_sync")
    assert (cfg.metrics.prometheus_host, cfg.metrics.prometheus_port) == ("0.0.0.0", 9400)
    assert cfg.rollout.n == 8 and cfg.placement.resource == "GPU" and cfg.data.seed == 123456789
    if values_path:
        assert cfg.model.path == "/models/Qwen2.5-7B-Instruct" and cfg.rollout.num_workers == 8
        assert cfg.data.prompt_suffix == ""  # no preset: nothing of the demo config leaks in


def test_7b_example_runs_fsdp2_trainer_ranks(tmp_path):
    """The 7B example's rendered run config (what the RayJob entrypoint reads) shards the trainer over 8
    GPUs with FSDP2 beside 8 one-GPU engines and the reference; tests/deploy/test_helm_7b_plan.py checks
    that this fits 80 GB GPUs."""
    objects = render(values_file(EXAMPLE_7B), name="grpo-7b")
    config_file, overrides = run_config_and_argv(objects, tmp_path)
    assert overrides == []
    raw = yaml.safe_load(config_file.read_text())
    assert raw["trainer"]["num_workers"] == 8 and raw["trainer"]["gradient_checkpointing"] is True
    cfg = load_config(config_file, overrides)
    t, p, r = cfg.trainer, cfg.placement, cfg.rollout
    assert (t.num_workers, t.gradient_checkpointing, t.precision) == (8, True, "bf16-autocast")
    assert (p.resource, p.mode, p.trainer_per_worker, p.reference_per_worker) == ("GPU", "disaggregated", 0.75, 0.25)
    assert (r.num_workers, r.tensor_parallel_size, p.rollout_per_worker) == (8, 1, 1.0)
    assert cfg.algo.kl_coef > 0 and cfg.memory.preflight and 0 < cfg.memory.device_gib <= 80
    assert r.prompts_per_step * r.n % (t.num_workers * t.mini_batches) == 0  # every rank gets an equal share
    assert "LIMIT" not in EXAMPLE_7B.read_text()  # the single-GPU trainer limit is gone with FSDP2


def test_metrics_ports_annotations_and_scrape_config(tmp_path):
    objects = render()
    rayjob = one(objects, "RayJob")
    config = yaml.safe_load(one(objects, "ConfigMap", "-config")["data"]["run.yaml"])
    templates = pod_templates(rayjob)
    for group, template in templates.items():
        ports = {p["name"]: p["containerPort"] for p in ray_container(template)["ports"]}
        assert ports["metrics"] == 8080, group
        assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        assert template["metadata"]["annotations"]["prometheus.io/port"] == "8080"
    head_ports = {p["name"]: p["containerPort"] for p in ray_container(templates["head"])["ports"]}
    assert head_ports["orch-metrics"] == config["metrics"]["prometheus_port"] == 9400
    spec = rayjob["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["rayStartParams"]["metrics-export-port"] == "8080"
    assert spec["workerGroupSpecs"][0]["rayStartParams"]["metrics-export-port"] == "8080"

    scrape = yaml.safe_load(one(objects, "ConfigMap", "-prometheus-scrape")["data"]["scrape_configs.yaml"])
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    assert set(jobs) == {"rl-orchestrator", "ray"}
    for job_name, port_name in (("rl-orchestrator", "orch-metrics"), ("ray", "metrics")):
        job = jobs[job_name]
        assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["rl"]}}]
        keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
        assert keep[("__meta_kubernetes_pod_container_port_name",)] == port_name
        assert keep[("__meta_kubernetes_pod_annotation_prometheus_io_scrape",)] == "true"
    result = promtool_check_config(scrape, tmp_path)
    if "field kubernetes_sd_configs not found" in result:
        # Debian's Prometheus is built without Kubernetes discovery: check the rest of each job (relabel
        # rules, interval, path) with a static target in its place.
        for job in scrape["scrape_configs"]:
            job["static_configs"] = [{"targets": ["127.0.0.1:8080"]}]
            del job["kubernetes_sd_configs"]
        result = promtool_check_config(scrape, tmp_path)
    assert result == "", result


def promtool_check_config(scrape: dict, tmp_path: Path) -> str:
    """`promtool check config` of a Prometheus config holding these scrape jobs: "" if valid, else its output."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Prometheus (`make system-deps`, scripts/install_system_deps.sh)"
    prometheus_yml = tmp_path / "prometheus.yml"
    prometheus_yml.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}, **scrape}))
    result = subprocess.run([promtool, "check", "config", "--syntax-only", str(prometheus_yml)],
                            capture_output=True, text=True, timeout=60)
    return "" if result.returncode == 0 else result.stdout + result.stderr


def test_metrics_disabled_drops_ports_annotations_and_scrape_config(tmp_path):
    objects = render({"metrics": {"enabled": False}})
    assert not [o for o in objects if o["metadata"]["name"].endswith("-prometheus-scrape")]
    for template in pod_templates(one(objects, "RayJob")).values():
        names = {p["name"] for p in ray_container(template).get("ports", [])}
        assert not names & {"metrics", "orch-metrics"}
        assert "prometheus.io/scrape" not in template["metadata"].get("annotations", {})
    config_file, overrides = run_config_and_argv(objects, tmp_path)
    assert load_config(config_file, overrides).metrics.prometheus_port == 0


def test_long_names_are_truncated_and_references_match(rayjob_validator):
    objects = render({"fullnameOverride": "a" * 40 + "-" + "b" * 22})  # 63 characters, the most allowed
    validate_all(objects, rayjob_validator)
    names = [o["metadata"]["name"] for o in objects]
    assert len(set(names)) == len(names) and max(map(len, names)) == 63
    assert len(one(objects, "RayJob")["metadata"]["name"]) <= 47
    template = pod_templates(one(objects, "RayJob"))["head"]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    assert volumes["run-config"]["configMap"]["name"] == one(objects, "ConfigMap", "-config")["metadata"]["name"]


def test_helm_lint_strict_passes():
    for values in ({}, values_file(EXAMPLE_7B)):
        report = helm.lint(str(CHART), values, strict=True)
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, problems


def test_every_value_is_documented():
    """Each key of values.yaml has a comment above it or above one of its parent keys (the run
    config inside `orchestrator.config` and flow mappings excepted)."""
    undocumented, parents = [], []  # parents: (indent, documented)
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([\w./-]+|\"\w+\"):", line)
        if not m:
            continue
        indent = len(m.group(1))
        parents = [p for p in parents if p[0] < indent]
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        documented = previous.startswith("#") or any(d for _, d in parents)
        parents.append((indent, documented))
        if not documented:
            undocumented.append(line.strip())
    assert not undocumented, f"values.yaml keys without a comment: {undocumented}"


def test_the_autoscaler_scales_the_worker_group_between_its_bounds(rayjob_validator):
    """autoscaler.enabled: KubeRay's in-tree autoscaler, the worker group between worker.minReplicas and
    worker.maxReplicas (an elastic run asks it for one more engine's group: docs/elastic.md)."""
    objects = render({"autoscaler": {"enabled": True, "idleTimeoutSeconds": 120, "upscalingMode": "Default"},
                      "worker": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4}})
    validate_all(objects, rayjob_validator)
    spec = one(objects, "RayJob")["spec"]["rayClusterSpec"]
    assert spec["enableInTreeAutoscaling"] is True and spec["autoscalerOptions"]["idleTimeoutSeconds"] == 120
    (group,) = spec["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 4)
    fixed = one(render(), "RayJob")["spec"]["rayClusterSpec"]  # off (the default): fixed at worker.replicas
    assert "enableInTreeAutoscaling" not in fixed
    assert {fixed["workerGroupSpecs"][0][k] for k in ("replicas", "minReplicas", "maxReplicas")} == {1}


def test_drain_on_stop_gives_worker_pods_a_pre_stop_drain_and_the_grace_period_for_it(rayjob_validator):
    """worker.drainOnStop: a stopped worker pod drains its own Ray node (`rl-orch drain --host <pod> --wait`) so an
    elastic run's engines leave between steps; the pod's grace period outlasts the drain's deadline."""
    from orchestrator.cli import build_parser

    drain = {"replicas": 1, "gpus": 1, "drainOnStop": {"enabled": True, "deadlineSeconds": 300}}
    with pytest.raises(helm.HelmRenderError, match=r"worker.drainOnStop.enabled \(or rolloutWorker's\) needs an elastic"):
        render({"worker": drain})  # the demo preset is not elastic: every stopped pod would wait out the deadline
    elastic = {"placement": {"elastic": True}, "rollout": {"num_workers": 1, "max_workers": 2}}
    objects = render({"worker": drain, "orchestrator": {"python": "/opt/venv/bin/python", "config": elastic}})
    validate_all(objects, rayjob_validator)
    worker = pod_templates(one(objects, "RayJob"))["gpu"]
    assert worker["spec"]["terminationGracePeriodSeconds"] == 330
    shell, flag, script = ray_container(worker)["lifecycle"]["preStop"]["exec"]["command"]
    assert (shell, flag) == ("sh", "-c")
    pod_env = {"$FQ_RAY_IP": "demo-raycluster-head-svc.rl.svc.cluster.local", "$(hostname)": "demo-gpu-worker-x7k"}
    for var, value in pod_env.items():
        script = script.replace(var, value)
    argv = shlex.split(script)
    assert argv[:3] == ["/opt/venv/bin/python", "-m", "orchestrator"]
    args = build_parser().parse_args(argv[3:])  # what the pod runs parses as `rl-orch drain`
    assert (args.address, args.host, args.deadline_s, args.wait) == (
        "demo-raycluster-head-svc.rl.svc.cluster.local:6379", ["demo-gpu-worker-x7k"], 300.0, True)
    assert "pod demo-gpu-worker-x7k is stopping" == args.reason_message
    off = pod_templates(one(render(), "RayJob"))["gpu"]  # off (the default): no hook, Kubernetes' grace period
    assert "lifecycle" not in ray_container(off) and "terminationGracePeriodSeconds" not in off["spec"]
    assert "lifecycle" not in ray_container(pod_templates(one(objects, "RayJob"))["head"])


def test_a_rollout_worker_group_takes_engines_and_keeps_the_trainer_on_the_worker_group(rayjob_validator, tmp_path):
    """rolloutWorker (e.g. spot nodes): a second worker group with its own bounds, selector, tolerations and the drain
    hook; the `worker` group advertises placement.trainer_node_resource, which the chart writes into the run config,
    so the job group's bundles stay on `worker` pods (orchestrator/placement/plan.py)."""
    spot = {"enabled": True, "replicas": 0, "minReplicas": 0, "maxReplicas": 6, "gpus": 8,
            "nodeSelector": {"cloud.google.com/gke-spot": "true"},
            "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Exists", "effect": "NoSchedule"}]}
    elastic = {"placement": {"elastic": True}, "rollout": {"num_workers": 1, "max_workers": 8}}
    objects = render({"autoscaler": {"enabled": True}, "rolloutWorker": spot, "orchestrator": {"config": elastic}})
    validate_all(objects, rayjob_validator)
    groups = {g["groupName"]: g for g in one(objects, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert sorted(groups) == ["gpu", "rollout"]
    assert groups["gpu"]["rayStartParams"]["resources"] == """'{"rl_orch_trainer_node": 1}'"""
    assert "resources" not in groups["rollout"]["rayStartParams"]
    assert (groups["rollout"]["minReplicas"], groups["rollout"]["maxReplicas"]) == (0, 6)
    pods = {name: g["template"] for name, g in groups.items()}
    assert pods["rollout"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    assert "lifecycle" in ray_container(pods["rollout"]) and "lifecycle" not in ray_container(pods["gpu"])
    assert pods["rollout"]["metadata"]["labels"]["app.kubernetes.io/component"] == "rollout-worker"
    config_file, overrides = run_config_and_argv(objects, tmp_path)
    cfg = load_config(config_file, overrides)
    assert cfg.placement.trainer_node_resource == "rl_orch_trainer_node" and cfg.placement.elastic
    off = one(render(), "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"]  # off (the default): one group
    assert [g["groupName"] for g in off] == ["gpu"] and "resources" not in off[0]["rayStartParams"]
    refused = [({"rolloutWorker": spot}, "rolloutWorker.enabled needs an elastic run"),  # the demo preset
               ({"rolloutWorker": {**spot, "groupName": "gpu"}, "orchestrator": {"config": elastic}},
                'rolloutWorker.groupName="gpu" is worker.groupName'),
               ({"rolloutWorker": spot, "worker": {"replicas": 1, "gpus": 1, "rayStartParams": {"resources": "'{\"a\": 1}'"}},
                 "orchestrator": {"config": elastic}}, 'the worker group must also advertise "rl_orch_trainer_node"')]
    for values, match in refused:
        with pytest.raises(helm.HelmRenderError, match=match):
            render(values)
    own = {"replicas": 1, "gpus": 1, "rayStartParams": {"resources": "'{\"a\": 1, \"stable\": 1}'"}}
    objects = render({"rolloutWorker": spot, "worker": own, "orchestrator": {
        "config": elastic, "overrides": ["placement.trainer_node_resource=stable"]}})
    groups = {g["groupName"]: g for g in one(objects, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert groups["gpu"]["rayStartParams"]["resources"] == own["rayStartParams"]["resources"]  # the user's, kept
    config_file, overrides = run_config_and_argv(objects, tmp_path)
    assert load_config(config_file, overrides).placement.trainer_node_resource == "stable"
