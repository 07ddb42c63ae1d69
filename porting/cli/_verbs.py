"""A command group whose old one-verb spelling keeps working for a release, with one deprecation line.

``port baseline --recipe R ...`` became ``port baseline run --recipe R ...`` and ``port baseline --import LOG``
became ``port baseline import LOG``: a user's scripts and notes still run, and stderr says the new spelling.
"""

from __future__ import annotations

from typing import Callable

import click


class VerbGroup(click.Group):
    """``old(args) -> new args`` rewrites an invocation that starts with an option (the old spelling) into one
    that starts with a verb; ``--help`` alone is left to the group."""

    def __init__(self, *args, old_spelling: Callable[[list[str]], tuple[list[str], str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.old_spelling = old_spelling

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and not set(args) & {"-h", "--help"}:
            args, note = self.old_spelling(list(args))
            click.echo(f"note: {note}", err=True)
        return super().parse_args(ctx, args)
