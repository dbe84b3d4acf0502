"""`python -m lab.machines.background RUN [--resume]`: a run's driver in a process of its own.

`lab.machines.control.spawn_driver` starts it in a session of its own, so it outlives the notebook or
terminal that started the run; it leaves a run another process drives to that one.
"""
from __future__ import annotations

import argparse
import sys

from lab.config import UserError
from lab.machines import driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.machines.background", description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run id (or a unique prefix) or run folder")
    parser.add_argument("--resume", action="store_true", help="forget an earlier cancel")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        final = driver.drive(args.run, resume=args.resume, progress=True)
    except driver.DriverBusy:  # another process drives it
        return 0
    except UserError as e:
        print(f"lab driver: error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1 if final.status == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
