"""The `lab` command: a thin layer over the package's API.

Each subcommand lives in the module that owns its work: "module" names a module with
`configure(parser)` and `run(args) -> int`, "module:name" one with `configure_<name>` and
`run_<name>`. Modules are imported only when their command runs, so `lab size` never
pays for importing torch.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from lab.api import VERSION
from lab.config import ConfigError, UserError
from lab.home import from_env, lab_home

# name -> (module, one-line help)
COMMANDS = {
    "prepare": ("lab.cli.prepare", "train the tokenizer and write token shards for constellations"),
    "train": ("lab.cli.train", "train a GPT in this process (or under torchrun)"),
    "size": ("lab.cli.size", "the sizing calculator: weights, tokens, speed, memory, quota"),
    "run": ("lab.cli.runs", "start or continue a run: the training notebook on a machine"),
    "runs": ("lab.cli.runs:listing", "the lab's runs with their links and lineage"),
    "plot": ("lab.cli.runs:plot", "redraw a run's loss plot"),
    "accounts": ("lab.cli.accounts", "the lab's Kaggle accounts: list with quota, add, remove"),
    "probe": ("lab.cli.probe", "test Kaggle accounts with a short session: GPUs, versions, NCCL, speed, data mount"),
    "machines": ("lab.cli.machines", "every machine (this computer, Kaggle accounts, the lab's boxes over SSH, "
                                     "Slurm clusters); add, remove and check boxes and clusters"),
    "watch": ("lab.cli.watch", "drive or follow a run to its end; resumes it after a crash, a fix or a cancel"),
    "cancel": ("lab.cli.watch:cancel", "stop a run: no further link; a session here or on a box saves and stops"),
    "branch": ("lab.cli.branch", "a cooldown branch: a short decay from a checkpoint of a WSD run"),
    "sweep": ("lab.cli.sweep", "a grid of runs (sizes, learning rates, schedules, cooldown points) with one table"),
    "fit": ("lab.cli.fit", "fit L(N, D) = E + A/N^alpha + B/D^beta to the lab's points, with intervals and plots"),
    "sample": ("lab.cli.sample", "text from a trained model (a run or a checkpoint), streamed as it is generated"),
    "eval": ("lab.cli.eval", "a trained model's loss per token and bits per byte on any text"),
    "export": ("lab.cli.export", "a trained model as safetensors + config + tokenizer + a model card"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lab", description="The lab kit.", epilog=home_line())
    parser.add_argument("--version", action="version", version=f"lab {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        # Parsers are configured lazily below, only for the command being run.
    return parser


def home_line() -> str:
    """Where the lab lives, and why there: the same folder the control notebook's setup cell shows."""
    why = "$LAB_HOME" if from_env() else "the kit's own; $LAB_HOME chooses another"
    return f"lab home: {lab_home()} ({why})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # First pass finds the command; the second parses its own flags.
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    target, help_text = COMMANDS[argv[0]]
    module_name, _, suffix = target.partition(":")
    module = importlib.import_module(module_name)
    configure = getattr(module, f"configure_{suffix}" if suffix else "configure")
    run = getattr(module, f"run_{suffix}" if suffix else "run")
    sub = argparse.ArgumentParser(prog=f"lab {argv[0]}", description=help_text)
    configure(sub)
    args = sub.parse_args(argv[1:])
    args.argv = argv[1:]  # for commands that re-launch themselves (lab train under torchrun)
    try:
        return int(run(args) or 0)
    except ConfigError as e:
        for p in e.problems:
            print(f"lab {argv[0]}: error: {p.en}", file=sys.stderr)
        return 2
    except UserError as e:
        print(f"lab {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
