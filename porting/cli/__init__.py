"""The `port` command. Every module in this package that defines ``command`` (a click command or
group) becomes a subcommand, so adding one is adding a file. Subcommand modules import heavy
libraries (MindSpore, torch) inside their functions, keeping ``port --help`` fast.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import click

from model_zoo.errors import PortingError, one_line


class PortGroup(click.Group):
    """Turns every PortingError into one line on stderr and a non-zero exit (``--debug``: traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PortingError as e:
            if ctx.meta.get("port_debug") or os.environ.get("PORT_DEBUG"):
                raise
            # one line whatever the message holds: a file name with a newline cannot forge a second line
            click.echo(f"error: {one_line(e)}", err=True)
            sys.exit(e.exit_code)


@click.group(cls=PortGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="""\b
Examples:
  port zoo list
  port verify --hf stories260k
  port generate --hf stories260k --max-new-tokens 60
  port convert --hf llama-7b --out ./llama-7b-ms
  port train recipes/tiny-cpu.yaml""")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="port", prog_name="port")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Move HF Llama-style models and their fine-tuning to Ascend 910C with MindSpore."""
    ctx.meta["port_debug"] = debug


def _register() -> None:
    pkg = sys.modules[__name__]
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        cmd = getattr(mod, "command", None)
        if isinstance(cmd, click.Command):
            main.add_command(cmd)


_register()
