"""What the RM publishes over MQTT, and when: job state events (a job's changes within a short window go out as
one retained event, its latest state), the cluster view (deltas as nodes change, a retained snapshot now and then,
both cut from the view cache), each node's GPU telemetry (checked, kept for the web UI, republished retained), and
the clearing of a retired job's retained topic.

`Publishing` owns the MQTT client once the RM has started it (the client itself, which publishes in the background
and never blocks, is rm/server/publisher.py) and the view cache (rm/server/viewcache.py). RMShell
(rm/server/daemon.py) tells it what changed, after the store commit: `job_event_soon` for a job, `view_changed` for
the cluster.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from gpurm.common import mqtt
from gpurm.common.model import Job
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.config import RMConfig
from gpurm.rm.server import convert
from gpurm.rm.server.publisher import Publisher, telemetry_problem
from gpurm.rm.server.telemetrybook import TelemetryBook
from gpurm.rm.server.viewcache import ViewCache
from gpurm.rm.state import views
from gpurm.rm.state.core import RMCore

JOB_EVENT_COALESCE_S = 0.02   # a job's state events within this go out as one (its latest state)


class Publishing:
    def __init__(self, config: RMConfig, epoch: int, core: Callable[[], RMCore], telemetry: TelemetryBook,
                 note_job: Callable[[Job], None]) -> None:
        """`core`: the shell's core now (a failed write replaces it: RMShell._roll_back). `note_job`: told of
        every job whose event comes due, published or not (retention's candidates to leave memory)."""
        self.config = config
        self.epoch = epoch
        self._core = core
        self.telemetry = telemetry
        self._note_job = note_job
        self.publisher: Publisher | None = None    # none until RMShell.run knows the broker
        self.views = ViewCache()
        self._view_dirty = asyncio.Event()
        self._job_events: dict[str, None] = {}       # jobs whose state event is due (coalesced)
        self._job_events_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ job events

    def job_event_soon(self, job_id: str) -> None:
        """Publish the job's state shortly: the changes one job goes through within JOB_EVENT_COALESCE_S (a
        submit and its AM's start, a gang's learners starting) go out as one event, its latest state."""
        self._job_events[job_id] = None
        if self._job_events_timer is None:
            self._job_events_timer = asyncio.get_running_loop().call_later(JOB_EVENT_COALESCE_S,
                                                                          self._publish_job_events)

    def publish_due_job_events(self) -> None:
        """The events still waiting for their timer, now (the RM stops: they go out before the publisher does)."""
        if self._job_events_timer is not None:
            self._job_events_timer.cancel()
            self._publish_job_events()

    def _publish_job_events(self) -> None:
        self._job_events_timer = None
        events, self._job_events = self._job_events, {}
        for job_id in events:
            self.publish_job(job_id)

    def publish_job(self, job_id: str) -> None:
        """The job's state now, retained on its topic."""
        core = self._core()
        job = core.jobs.get(job_id)
        if job is not None:
            self._note_job(job)        # a finished job becomes a candidate to leave memory
        if job is None or self.publisher is None:
            return
        attempt = job.current_attempt
        event = {
            "job_id": job.job_id, "state": job.state.name, "queue": job.queue, "user": job.user,
            "gpus": job.spec.gpus, "attempt": attempt.number if attempt else 0,
            "diagnostics": job.diagnostics, "exit_code": job.exit_code,
            "waiting_reason": views.with_notes(job.waiting_reason, core.job_containers(job_id))
            if not job.state.terminal else job.waiting_reason,
            "live_containers": core.live_count(job_id), "time": time.time(),
        }
        self.publisher.publish_retained(mqtt.TOPIC_JOB.format(job_id=job_id), json.dumps(event).encode())

    def clear_job(self, job_id: str) -> None:
        """A job left memory: its retained event goes (an empty retained payload deletes the retained message)."""
        if self.publisher is not None:
            self.publisher.publish_retained(mqtt.TOPIC_JOB.format(job_id=job_id), b"")

    # ------------------------------------------------------------ telemetry

    def publish_telemetry(self, node_id: str, payload: bytes) -> str:
        """Republish a node's telemetry (from its heartbeat) retained on its own topic; a reason when refused."""
        problem = telemetry_problem(node_id, payload)
        if problem:
            return problem
        self.telemetry.record(node_id, payload)
        if self.publisher is not None:
            self.publisher.publish_retained(mqtt.TOPIC_TELEMETRY.format(node_id=node_id), payload)
        return ""

    # ------------------------------------------------------------ the cluster view

    def view_changed(self) -> None:
        """The cluster changed (or memory was rolled back): the view loop publishes what changed."""
        self._view_dirty.set()

    def view_bytes(self) -> bytes:
        """The full cluster view, encoded (shared by every reader of this view version)."""
        return self.views.full(self._core(), self.epoch, time.time())

    async def view_loop(self) -> None:
        """Deltas (only the changed nodes, each whole) as the cluster changes, at most every
        `view_publish_interval`; a retained full snapshot every `view_snapshot_interval` when anything changed,
        so a new subscriber starts from a recent snapshot and follows the deltas. Both are cut from the view
        cache: each node is encoded once per change (rm/server/viewcache.py)."""
        published = 0                 # version of the last view sent (delta or snapshot)
        snapshot_at = 0.0
        snapshot_version = -1
        while True:
            await self._view_dirty.wait()
            self._view_dirty.clear()
            if self.publisher is not None:
                core = self._core()
                version = core.cluster.version
                changed = self.views.take_delta(core)
                if changed:
                    header = pb.ClusterView(version=version, time_ms=convert.ms(time.time()),
                                            base_version=published, epoch=self.epoch, delta=True)
                    self.publisher.publish(mqtt.TOPIC_VIEW_DELTA,
                                           header.SerializeToString() + self.views.entries(changed))
                    published = version
                due = time.monotonic() - snapshot_at >= self.config.view_snapshot_interval_s
                if version != snapshot_version and due:
                    self.publisher.publish_retained(mqtt.TOPIC_VIEW, self.view_bytes())
                    snapshot_at, snapshot_version = time.monotonic(), version
                    published = max(published, version)
                elif version != snapshot_version:
                    self._view_dirty.set()      # a snapshot is due later; come back for it
            await asyncio.sleep(self.config.view_publish_interval_s)
