"""The run's fields as a command's flags: one `--flag` per field (`lab.config.flag_specs`), and
the fields a command was given (its `--config` JSON file, then its flags on top).

Control side only (argparse, files): `lab.config` itself is pasted into the training notebook."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterable

from lab.config import UserError, field_names
from lab.fields import flag_specs

# Where a run goes is a command's own option (`lab run --machine`), not a flag of the run's fields.
NOT_FLAGS = ("machine",)


def add_config_flags(parser: argparse.ArgumentParser, exclude: Iterable[str] = NOT_FLAGS) -> None:
    """One --flag per RunConfig field, from the fields' own definition."""
    for opts, kw in flag_specs(exclude=exclude):
        parser.add_argument(*opts, **kw)


def fields_from_args(args: argparse.Namespace, exclude: Iterable[str] = NOT_FLAGS) -> dict:
    """The fields given (name -> value): the `--config` JSON file's, then the flags' on top.
    Values stay as given; `RunConfig.from_dict` types and checks them."""
    values: dict = {}
    if getattr(args, "config", None):
        try:
            loaded = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read config file {args.config}: {e}") from None
        if not isinstance(loaded, dict):
            raise UserError(f"config file {args.config} does not hold a JSON object of run fields")
        values.update(loaded)
    skip = set(exclude)
    values.update({name: getattr(args, name) for name in field_names()
                   if name not in skip and getattr(args, name, None) is not None})
    return values
