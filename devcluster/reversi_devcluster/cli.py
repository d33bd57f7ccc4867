"""``reversi-devcluster``: build, start, stop and inspect the local control plane.

    reversi-devcluster build [--all] [COMPONENT...]
                                         build missing binaries (kubernetes, etcd; --all adds
                                         helm, promtool, kstatus-check and the real node's parts)
    reversi-devcluster up                start etcd, kube-apiserver, kube-controller-manager, node agent
    reversi-devcluster up --real-node    ... with a real node instead of the node agent: containerd, runc,
                                         kubelet, kube-scheduler, kube-proxy, CoreDNS, images built here (root)
    reversi-devcluster images            build the real node's images from this checkout (and load them)
    reversi-devcluster down              stop them all
    reversi-devcluster status            each component's pid, state and log
    reversi-devcluster kubeconfig        print the admin KUBECONFIG path
    reversi-devcluster kubeconfig --user alice --group devs
                                         mint a kubeconfig for any user and groups
    reversi-devcluster env               print `export KUBECONFIG=...` (eval "$(reversi-devcluster env)")

Exit status is non-zero on any failure, with the failing component and its log named.
"""

from __future__ import annotations

import json
import shlex
import signal
import sys

import click
from pydantic import ValidationError

from . import build as build_mod
from . import realnode
from .cluster import Cluster, ClusterError, ClusterSettings
from .images import ImageError


@click.group(help="Build, start, stop and inspect the local control plane (etcd, kube-apiserver, "
                  "kube-controller-manager and a node agent on loopback).")
def cli() -> None:
    pass


@cli.command()
@click.argument("components", nargs=-1,
                type=click.Choice(list(build_mod.components())))
@click.option("--all", "all_", is_flag=True,
              help="Also build helm, promtool, the kstatus checker (cli-utils) and the real node's parts.")
@click.option("--force", is_flag=True, help="Rebuild even if the binaries exist.")
def build(components: tuple[str, ...], all_: bool, force: bool) -> None:
    """Build the pinned binaries that are missing from the cache (default: kubernetes, controller-manager, etcd)."""
    names = list(components) or list(build_mod.CONTROL_PLANE_COMPONENTS) + (
        ["helm", "prometheus", "cli-utils", *build_mod.NODE_COMPONENTS] if all_ else [])
    try:
        comps = build_mod.build(names, force=force)
    except build_mod.BuildError as err:
        raise click.ClickException(str(err)) from err
    for comp in comps.values():
        click.echo(f"{comp.name} {comp.version}: {comp.bindir}")


@cli.command()
@click.option("--real-node", is_flag=True, envvar="REVERSI_REAL_NODE",
              help="Run pods in real containers: containerd, runc, kubelet, kube-scheduler, kube-proxy and the "
                   "cluster DNS, CoreDNS (needs root; builds them and the images on first use) instead of the node "
                   "agent.")
def up(real_node: bool) -> None:
    """Start the control plane (reusing a running one) and wait for a Ready node."""
    try:
        settings = ClusterSettings(real_node=real_node)
    except ValidationError as err:
        first = err.errors()[0]
        raise click.ClickException(f"bad REVERSI_{str(first['loc'][0]).upper()}: {first['msg']}") from None
    # a SIGTERM mid-way stops what was started, as Ctrl-C does (up's own clean-up on any exception)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        Cluster(settings).up(log=click.echo)
    except (ClusterError, build_mod.BuildError, ImageError) as err:
        raise click.ClickException(str(err)) from err


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@cli.command()
def images() -> None:
    """Build the real node's images from this checkout (what changed) and, when its real node
    runs, load them into its containerd (pods started from then on run them). Where this machine
    cannot run a real node, say why and do nothing."""
    why = realnode.unsupported()
    if why:
        click.echo(f"no real node on this machine ({why}): no images to build")
        return
    c = Cluster(ClusterSettings(real_node=True))
    try:
        c.real.build(log=click.echo)
        if c.is_running():
            c.real.load_images(log=click.echo)
    except (build_mod.BuildError, ImageError) as err:
        raise click.ClickException(str(err)) from err


@cli.command()
def down() -> None:
    """Stop every component; no process is left behind."""
    Cluster().down(log=click.echo)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(as_json: bool) -> None:
    """Show each component's pid, whether it runs, and its log. Exit 1 when not all run."""
    c = Cluster()
    st = c.status()
    if as_json:
        click.echo(json.dumps({"server": c.server, "kubeconfig": str(c.paths.admin_kubeconfig),
                               "components": st}, indent=2))
    else:
        for name, s in st.items():
            state = "running" if s["running"] else "stopped"
            click.echo(f"{name:<24} {state:<8} pid={s['pid'] or '-':<8} log={s['log']}")
        click.echo(f"server: {c.server}\nKUBECONFIG={c.paths.admin_kubeconfig}")
    if not all(s["running"] for s in st.values()):
        sys.exit(1)


@cli.command()
@click.option("--user", help="User name (the client certificate's common name).")
@click.option("--group", "groups", multiple=True, help="A group of the user; repeatable.")
def kubeconfig(user: str | None, groups: tuple[str, ...]) -> None:
    """Print the admin kubeconfig path, or mint one for --user in --group groups."""
    c = Cluster()
    if user:
        click.echo(str(c.kubeconfig_for(user, tuple(groups))))
    else:
        click.echo(str(c.paths.admin_kubeconfig))


@cli.command()
def env() -> None:
    """Print shell lines that point KUBECONFIG at the local cluster and put the pinned kubectl
    (built with the control plane, within the supported version skew) first on PATH:
    eval "$(reversi-devcluster env)"."""
    for line in env_lines():
        click.echo(line)


def env_lines() -> list[str]:
    """``export KUBECONFIG=...`` and, once kubectl is built, ``export PATH=<its folder>:$PATH``."""
    lines = [f"export KUBECONFIG={shlex.quote(str(Cluster().paths.admin_kubeconfig))}"]
    kubectl = build_mod.binary("kubernetes", "kubectl")
    if kubectl.exists():
        lines.append(f"export PATH={shlex.quote(str(kubectl.parent))}:\"$PATH\"")
    return lines


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
