"""`port ranktable gen|check|merge`: HCCL rank tables v1.0 (910/A2) and v1.2 (910C super pod)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from model_zoo.errors import VerificationError


@click.group("ranktable", epilog="""\b
Examples:
  port ranktable check rank_table.json
  port ranktable check rank_table.json --nodes 2 --cards-per-node 16
  port ranktable check rank_table.json --recipe recipes/7b-a2-8dev.yaml --json
  port ranktable gen --server node_0:172.16.0.110 --server node_1:172.16.0.111 --devices 0-7 \\
      --hccn-conf node_0=/etc/hccn.conf --hccn-conf node_1=hccn_node1.conf --out rank_table.json
  port ranktable gen --version 1.2 --super-pod-size 2 --server a --server b --devices 0-15 --out rt.json
  port ranktable merge node0.json node1.json --out rank_table.json""")
def command() -> None:
    """Generate, check and merge HCCL rank tables."""


def _report(problems, as_json: bool, summary: dict, path: str) -> None:
    from porting.cluster.ranktable import errors_of

    errs = errors_of(problems)
    if as_json:
        click.echo(json.dumps({"file": path, "summary": summary, "ok": not errs,
                               "problems": [p.__dict__ for p in problems]}, indent=2))
    else:
        click.echo(f"{path}: version {summary['version']}, {summary['servers']} server(s), "
                   f"{summary['devices']} device(s), {summary['super_pods']} super pod(s)")
        for p in problems:
            click.echo(f"  {p}")
        if not problems:
            click.echo("  ok: every documented rule holds")
    if errs:
        raise VerificationError(f"{path}: {len(errs)} rank table error(s); first: {errs[0].where}: {errs[0].message}")


@command.command("check", epilog="""\b
Examples:
  port ranktable check rank_table.json
  port ranktable check rank_table.json --nodes 4 --cards-per-node 16 --json""")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--nodes", type=click.IntRange(min=1), help="Expected number of servers.")
@click.option("--cards-per-node", type=click.IntRange(min=1), help="Expected devices per server.")
@click.option("--recipe", type=click.Path(path_type=Path),
              help="Read cluster.nodes / cluster.devices_per_node from a `port train` recipe (the strict loader).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_cmd(file: Path, nodes: int | None, cards_per_node: int | None, recipe: Path | None, as_json: bool) -> None:
    """Check every documented rule; each problem names its entry. Exit 1 on errors."""
    from porting.cluster import ranktable as rt

    if recipe is not None:
        from porting.train.recipe.schema import load_recipe

        cluster = load_recipe(recipe, check_files=False).cluster
        nodes = nodes if nodes is not None else cluster.nodes
        cards_per_node = cards_per_node if cards_per_node is not None else cluster.devices_per_node
    table = rt.load(file)
    try:
        problems = rt.check(table, nodes=nodes, cards_per_node=cards_per_node)
    except rt.DiagnosticsError as e:
        raise rt.DiagnosticsError(f"{file}: {e}") from None
    _report(problems, as_json, rt.summary(table), str(file))


@command.command("gen", epilog="""\b
Examples:
  port ranktable gen --server node_0 --devices 0-7 --out rank_table.json
  port ranktable gen --server node_0:10.0.0.1 --devices 0-1 \\
      --device-ip node_0:0=192.168.1.8 --device-ip node_0:1=192.168.1.9 --out rank_table.json
  port ranktable gen --version 1.2 --super-pod-size 2 --server a --server b --devices 0-15 --out rt.json""")
@click.option("--server", "servers", multiple=True, required=True, help="SERVER_ID[:HOST_IP], in rank order; repeat.")
@click.option("--devices", default="0-7", show_default=True, help="Device ids on every server (0-7, or 0,1,2,3).")
@click.option("--device-ip", "device_ips", multiple=True, help="SERVER_ID:DEVICE_ID=IP; repeat.")
@click.option("--hccn-conf", "hccn", multiple=True, help="[SERVER_ID=]PATH of an /etc/hccn.conf (address_N=IP).")
@click.option("--version", "version", type=click.Choice(["1.0", "1.2"]), default="1.0", show_default=True)
@click.option("--super-pod-size", type=click.IntRange(min=1), help="Servers per super pod (v1.2).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Where to write the table.")
def gen_cmd(servers, devices, device_ips, hccn, version, super_pod_size, out: Path) -> None:
    """Generate a rank table from servers and devices (device IPs given or read from hccn.conf)."""
    from porting.cluster import generate as rt

    _check_out(out, [h.partition("=")[2] or h for h in hccn])
    entries = rt.servers_from_specs(servers, devices, device_ips, hccn)
    table = rt.generate(entries, version=version, super_pod_size=super_pod_size)
    _check_then_write(table, out, "generated",
                      f"version {version}, {len(entries)} server(s) x {len(entries[0]['devices'])} device(s)")


def _is_rank_table(p: Path) -> bool:
    """A rank table (HCCL's format has no room for a writer's mark): a JSON object with a version and a server
    list. Only such a file is replaced; a config, a log or notes at --out never are."""
    from model_zoo import files
    from model_zoo.errors import PortingError

    try:
        doc = files.read_json_object(p, max_bytes=16 << 20)
    except PortingError:
        return False
    return doc.get("version") in ("1.0", "1.2") and isinstance(doc.get("server_list"), list)


def _check_out(out: Path, inputs: list) -> None:
    """The converters' rule for ``--out``: a new path or an existing rank table, never an input, never a link,
    never any other file."""
    from converters.atomic import check_out
    from porting.cluster import ranktable as rt

    check_out(out, kind="file", inputs=inputs, ours=_is_rank_table, what="a rank table", error=rt.DiagnosticsError)


def _check_then_write(table: dict, out: Path, what: str, summary: str) -> None:
    """Refuse a table that fails the rules (nothing written); else write it atomically and list warnings."""
    from porting.cluster import ranktable as rt
    from porting.cluster.generate import write_table

    problems = rt.check(table)
    errs = rt.errors_of(problems)
    if errs:
        raise rt.DiagnosticsError(f"{what} table would be invalid: {errs[0]}; nothing written to {out}")
    write_table(table, out)
    click.echo(f"wrote {out}: {summary}")
    for p in problems:
        click.echo(f"  {p}")


@command.command("merge", epilog="""\b
Examples:
  port ranktable merge node0.json node1.json --out rank_table.json""")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Where to write the merged table.")
def merge_cmd(files, out: Path) -> None:
    """Merge per-server tables (in the given order), renumbering rank ids 0..N-1, then check."""
    from porting.cluster import ranktable as rt
    from porting.cluster.generate import merge

    _check_out(out, list(files))
    merged = merge([(str(f), rt.load(f)) for f in files])
    _check_then_write(merged, out, "merged", rt.summary(merged))
