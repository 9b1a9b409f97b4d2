"""`SharedView`: the one cluster `View` every simulated AM plans on, as the AM processes read it from the RM's
MQTT view: the RM core's planning view (rm/state/planview.py), kept up to date from the servers that changed."""

from __future__ import annotations

from gpurm.am.placement import View
from gpurm.rm.state.core import RMCore


class SharedView:
    """The cluster view of the RM's cluster model at its current version."""

    def __init__(self, core: RMCore) -> None:
        self.core = core

    def current(self) -> View:
        return self.core.planview.current()
