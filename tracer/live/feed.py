"""The run's own requests in a live session: each joins the running loop at its arrival step
(`nanoengine trace --live --arrive 0,0,4,9`, a scenario's `arrive`), by tracer.loop.arrivals' is_due
as tracer.loop.drive does for a recorded run, but from inside the loop thread after each step.

    ArrivalFeed(control, arrivals).start()
"""

from __future__ import annotations

from tracer.live.control import EngineControl
from tracer.loop.arrivals import Arrival, is_due, sorted_arrivals
from tracer.loop.engine_loop import LoopRequest


class ArrivalFeed:
    def __init__(self, control: EngineControl, arrivals: list[Arrival]) -> None:
        self.control = control
        self.pending = sorted_arrivals(arrivals)

    def start(self) -> ArrivalFeed:
        """Add the step-0 arrivals before the first step; the rest after the step before theirs."""
        loop = self.control.loop
        loop.submit(self.add_due)
        loop.add_step_callback(lambda appended: self.add_due())
        return self

    def add_due(self) -> None:
        """In the loop thread: every arrival due before the next step (an idle engine takes no empty
        steps, so the next one joins at once, as in a recorded run)."""
        loop = self.control.loop
        engine = loop.engine
        while self.pending and is_due(self.pending[0].step, engine.num_steps, not engine.has_unfinished()):
            arrival = self.pending.pop(0)
            request = LoopRequest(arrival.prompt, arrival.params, self.control.on_update, {"arrive": arrival.step})
            loop.admit(request)
