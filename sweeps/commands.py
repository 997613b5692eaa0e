"""What a file of sweeps/ does when it is run as a script (`python sweeps/X.py`). The commands
run: sweeps/run.py (`python -m sweeps.run STUDY`, every study), the study modules (ablation.py,
fedl2p.py, fedselect_grid.py: their study) and rejudge.py. A part of the runner that a user may
take for a command (study.py) calls `not_a_command` when run as a script, so that it says in one
line what to run instead rather than printing nothing. This module imports nothing of sweeps/
(any module may import it without a cycle)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn


def not_a_command(path: str) -> NoReturn:
    """One line to stderr naming the command to run instead of the module at `path`; exit status 2."""
    print(f"error: sweeps/{Path(path).name} is a part of the study runner, not a command; start a study with "
          "`python -m sweeps.run STUDY` (`python -m sweeps.run --help` lists the studies)", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    not_a_command(__file__)
