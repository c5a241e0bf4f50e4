"""``concord compose`` and ``concord k8s``: the click commands (added to `concord.lab.cli`'s
group) with the options the two generators share, and what each prints when done.

Heavy imports (the config, the generators, the certificates) happen inside the commands.
docs/deployment.md#docker-compose and #kubernetes describe the output.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from concord.lab.cli_common import F, fail, options
from concord.lab.deploy_common import METRICS_PORT

if TYPE_CHECKING:
    from concord.core.config import RunConfig
    from concord.lab.compose_gen import ComposeOptions
    from concord.lab.k8s import K8sOptions

_SIZE = re.compile(r"\d+(?:\.\d+)?(?:[KMGT]i?)?")


def shared_options(out_help: str, config_help: str) -> Callable[[F], F]:
    """The options both generators take: --peers, --out, --config, --tls, --auth,
    --metrics-port, --force."""
    return options(
        click.option(
            "--peers", "-n", type=click.IntRange(min=2), required=True, help="number of peers (≥ 2)"
        ),
        click.option(
            "--out", type=click.Path(file_okay=False, path_type=Path), required=True, help=out_help
        ),
        click.option(
            "--config",
            "config",
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            default=None,
            help=config_help,
        ),
        click.option("--tls", is_flag=True, help="mTLS between peers and signed control messages"),
        click.option("--auth", is_flag=True, help="broker passwords, ACL and TLS"),
        click.option(
            "--metrics-port",
            type=click.IntRange(min=0, max=65535),
            default=METRICS_PORT,
            show_default=True,
            help="each process's Prometheus endpoint (--metrics-listen 0.0.0.0:PORT); 0: none",
        ),
        click.option("--force", is_flag=True, help="replace files already in --out"),
    )


def _pick(params: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: params[name] for name in names}


def _shared(params: dict[str, Any]) -> dict[str, Any]:
    """The fields both generators' options take from `shared_options`' parameters (--out and
    --config as the user wrote them; --force is for the writing)."""
    config = params["config"]
    return {
        **_pick(params, "peers", "tls", "auth", "metrics_port"),
        "out": str(params["out"]),
        "config": None if config is None else str(config),
    }


def _generate(
    params: dict[str, Any],
    default_text: str,
    render: Callable[[RunConfig, str], dict[str, str]],
    *,
    generated: str,
    stale_glob: str,
    private: Iterable[str] = (),
    errors: tuple[type[Exception], ...] = (),
) -> tuple[RunConfig, dict[str, str], list[Path]]:
    """What both generators do with their parsed ``params``: read the run config (--config, or
    ``default_text`` when none is given), ``render`` the files from the config and its text, and
    write them under --out (`concord.lab.deploy_common.write_files`; ``certs.sh`` executable,
    ``private`` ones 0600, --force replaces). A config, deployment or ``errors`` exception is the
    command's error. Returns the config, the files and the paths written."""
    import tomllib

    from concord.core.config import ConfigError, build_config, load_config
    from concord.lab.deploy_common import DeployError, write_files

    caught: tuple[type[Exception], ...] = (ConfigError, DeployError, *errors)
    config: Path | None = params["config"]
    text = default_text if config is None else config.read_text(encoding="utf-8")
    try:
        cfg = load_config(config, environ={}) if config else build_config(tomllib.loads(text))
        files = render(cfg, text)
        written = write_files(
            params["out"],
            files,
            force=params["force"],
            generated=generated,
            executable={"certs.sh"},
            private=private,
            stale_glob=stale_glob,
        )
    except caught as exc:
        fail(str(exc))
    return cfg, files, written


# ------------------------------------------------------------------------------------ compose


@click.command("compose")
@shared_options(
    "directory for the compose files (e.g. compose)",
    "run config to ship as run.toml; its peers must be --peers (default: a small run)",
)
@click.option(
    "--project",
    default=None,
    metavar="NAME",
    help="compose project name (containers, network, volume); default: from the run's name",
)
@click.option(
    "--shape", metavar="RATE", default=None, help="overlay: cap each peer's link with tc (100mbit)"
)
@click.option(
    "--cpus",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="overlay: CPUs per peer",
)
@click.option("--memory", metavar="SIZE", default=None, help="overlay: memory per peer (2g)")
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="overlay: GPUs on the host; one per peer, round-robin",
)
@click.option(
    "--context",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=Path("."),
    show_default=True,
    help="the image's build context: the Concord repository root",
)
def compose_cmd(**params: Any) -> None:
    """Write a docker compose stack for N peers: compose.yaml and the overlays asked for."""
    from concord.lab.compose_gen import default_run_toml, project_name, render, workflow
    from concord.lab.compose_image import GENERATED

    out: Path = params["out"]
    context: Path = params["context"]
    if not (context / "pyproject.toml").is_file():
        fail(f"--context {context}: not the Concord repository root (no pyproject.toml there)")
    options = compose_options(params)
    cfg, files, written = _generate(
        params,
        default_run_toml(options.peers),
        lambda cfg, text: render(options, cfg, text),
        generated=GENERATED,
        stale_glob="compose.*.yaml",
    )
    click.echo(f"wrote {len(written)} files to {out}:")
    for path in written:
        click.echo(f"  {path}")
    project = project_name(options, cfg)
    steps = workflow(options, [n for n in files if n.startswith("compose.")], project)
    root = os.geteuid() == 0
    if root:  # the image never runs as root: give the keys to an unprivileged uid
        steps[0] = steps[0].replace("CONCORD_UID=$(id -u)", "CONCORD_UID=1000")
    first = [f"sh {out / 'certs.sh'}"] if "certs.sh" in files else []
    if root and first:
        first.append(f"chown -R 1000 {out / 'certs'}")
    if first:
        click.echo(f"first: {' && '.join(first)}   (the identities; keys 0600)")
    click.echo(f"then, from this directory (the compose project {project!r}):")
    for step in steps:
        click.echo(f"  {step}")
    why = "so that the containers can read the 0600 keys and you the files they write"
    if root:
        why += " (you are root, and the image never runs as root: uid 1000 owns the keys)"
    click.echo(f"CONCORD_UID: the image's user gets this uid, {why}.")
    click.echo(
        "`wait` returns when the run ends, with the orchestrator's exit status (Mosquitto keeps "
        f"running: a plain `up` never returns); `cp` copies every run directory to runs/{project}."
    )
    if options.metrics_port:
        url = f"http://127.0.0.1:{options.metrics_port}/metrics"
        click.echo(
            f"metrics: port {options.metrics_port} of each Concord container, on the stack's "
            "network only (no host port); from the host: docker compose … exec peer-0 python -c "
            f"\"import urllib.request as u; print(u.urlopen('{url}').read().decode())\""
        )


def compose_options(params: dict[str, Any]) -> ComposeOptions:
    """The `ComposeOptions` of ``concord compose``'s parsed parameters."""
    from concord.lab.compose_gen import ComposeOptions

    root, target = Path(params.get("context") or ".").resolve(), params["out"].resolve()
    return ComposeOptions(
        **_shared(params),
        **_pick(params, "shape", "cpus", "memory", "project"),
        gpus=params["gpus"] or 0,
        context=Path(os.path.relpath(root, target)).as_posix(),
        dockerfile=Path(os.path.relpath(target / "Dockerfile", root)).as_posix(),
    )


# ---------------------------------------------------------------------------------- kubernetes


def _storage(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if _SIZE.fullmatch(value):
        raise click.BadParameter(
            f"{value!r} is a size: --storage picks the layout (rwo or rwx); the size is "
            f"--storage-size {value}"
        )
    if value not in ("rwo", "rwx"):
        raise click.BadParameter(f"{value!r}: expected rwo (a volume per process) or rwx (one)")
    return value


@click.command("k8s")
@shared_options(
    "directory for the manifests (kubectl apply -f DIR)",
    "run config for the ConfigMap; its peers must be --peers (default: a small run)",
)
@click.option(
    "--name",
    default="concord",
    show_default=True,
    help="prefix of every object name (several runs share a namespace)",
)
@click.option("--image", default="concord:local", show_default=True, help="the Concord image")
@click.option(
    "--certs",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="identities for the Secrets; what is missing is issued (default: OUT/certs)",
)
@click.option("--cpu", default="1", show_default=True, help="CPU request per peer")
@click.option("--memory", default="2Gi", show_default=True, help="memory per peer")
@click.option("--gpu", is_flag=True, help="one nvidia.com/gpu per peer (a CUDA build of torch)")
@click.option(
    "--storage",
    default="rwo",
    show_default=True,
    callback=_storage,
    metavar="rwo|rwx",
    help="run directories: rwo, a ReadWriteOnce volume per process (any storage class); rwx, "
    "one ReadWriteMany volume (needs an RWX class)",
)
@click.option(
    "--storage-size",
    default=None,
    metavar="SIZE",
    help="size of each volume (default: 1Gi per process with rwo, 10Gi with rwx)",
)
@click.option("--storage-class", default=None, metavar="NAME", help="storage class of the volumes")
@click.option(
    "--metrics-namespace",
    default=None,
    metavar="NAME",
    help="a namespace (e.g. monitoring) whose pods may scrape, besides the run's own",
)
def k8s_cmd(**params: Any) -> None:
    """Write Kubernetes manifests for N peers: ConfigMaps, Secrets, broker, orchestrator, peers,
    volumes, network policies and the metrics Service."""
    from concord.lab.k8s import (
        GENERATED,
        PRIVATE,
        certs_script,
        check,
        default_run_toml,
        gitignore,
        issue_identities,
        render,
    )
    from concord.peer.certs import CertError

    out: Path = params["out"]
    options = k8s_options(params)
    secured = options.tls or options.auth
    certs_dir: Path = params["certs"] or out / "certs"
    inside = certs_dir.resolve().is_relative_to(out.resolve())
    issued: list[str] = []

    def render_all(cfg: RunConfig, text: str) -> dict[str, str]:
        check(options, cfg)
        if secured:
            issued.extend(issue_identities(options, cfg, certs_dir))
        files = render(options, cfg, text, certs_dir)
        if secured:
            files["certs.sh"] = certs_script(options, cfg, str(certs_dir))
        ignored = certs_dir.resolve().relative_to(out.resolve()).as_posix() if inside else None
        files[".gitignore"] = gitignore(ignored)
        return files

    _, _, written = _generate(
        params,
        default_run_toml(options.peers, options.name),
        render_all,
        generated=GENERATED,
        private=PRIVATE,
        stale_glob="*.yaml",
        errors=(CertError, ValueError),
    )
    for what in issued:
        click.echo(f"issued {what} in {certs_dir}")
    click.echo(f"wrote {len(written)} files to {out}; apply with: kubectl apply -f {out}")
    if secured:
        click.echo(
            f"{out}/secrets.yaml (0600) and {certs_dir} hold private keys: {out}/.gitignore "
            + ("covers both" if inside else f"covers secrets.yaml; keep {certs_dir} out of git")
        )


def k8s_options(params: dict[str, Any]) -> K8sOptions:
    """The `K8sOptions` of ``concord k8s``'s parsed parameters."""
    from concord.lab.k8s import K8sOptions

    own = ("name", "image", "cpu", "memory", "gpu", "storage", "storage_size", "storage_class")
    return K8sOptions(**_shared(params), **_pick(params, *own, "metrics_namespace"))
