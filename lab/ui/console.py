"""What the console's panels share: one view of the lab's machines, asked of Kaggle once and kept
until it is stale (`lab.api.machines.View`: the machines panel's Refresh, an account added or
removed, a probe ended, a run started or ended, or five minutes), so the form's Auto preview asks
no service per keystroke."""
from __future__ import annotations

from lab.api.machines import View
from lab.ui.parts import hear

machines = View()
for _topic in ("runs", "started"):  # a run started (any cell) or ended: who is busy has changed
    hear(_topic, "console", lambda *_: machines.forget())
