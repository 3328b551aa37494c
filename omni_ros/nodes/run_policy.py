"""The RunPolicy action of the policy node (`topics.run_policy`, default /omni_ros/run_policy).

"Run this policy on this prompt until success, time-out or cancel", for task executives and behaviour trees.
One goal at a time: a new goal preempts the running one (which ends `canceled`). Cancel, e-stop and every end
hold the robot at once (the executor's pause: no further commands) before the goal's answer goes out. A goal
sent while the node is inactive or its inputs are stale is accepted and waits, saying why in its feedback,
until `max_duration_s`. The prompt topic keeps working beside it for users who do not use actions.

`GoalRun` is the goal's bookkeeping without ROS; `RunPolicyServer` puts it on an rclpy ActionServer. Every
callback here runs on the node's executor thread (single-threaded), so goal state needs no lock; the only
other thread, the control loop, is stopped through `PolicyLoop.hold()`, which waits out a running tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_ros.control.executor import ExecState

if TYPE_CHECKING:
    from omni_ros.nodes.policy_loop import PolicyLoop

SUCCEEDED, TIMED_OUT, CANCELED, ABORTED = "succeeded", "timed_out", "canceled", "aborted"
WAITING, INFERRING, EXECUTING, HOLDING = "waiting", "inferring", "executing", "holding"
# How often the server checks a goal's time-out (its feedback follows the status period).
CHECK_HZ = 20.0


@dataclass
class Progress:
    """One feedback's content."""

    elapsed_s: float
    chunks: int
    commands: int
    last_inference_ms: float
    state: str
    waiting_for: str


@dataclass
class GoalRun:
    """One goal's clock, counters (from the loop's, at its start) and end."""

    prompt: str
    max_duration_s: float
    start: float
    chunks0: int
    commands0: int
    outcome: str = ""
    reason: str = ""
    end: float = 0.0

    def finish(self, outcome: str, reason: str, now: float) -> bool:
        """End the goal (the first end wins); False when it had already ended."""
        if self.outcome:
            return False
        self.outcome, self.reason, self.end = outcome, reason, now
        return True

    def timed_out(self, now: float) -> bool:
        return self.max_duration_s > 0 and now - self.start >= self.max_duration_s

    def progress(self, loop: PolicyLoop, now: float, dry_run: bool) -> Progress:
        health = loop.counters.health(now)
        state, why = goal_state(loop, now, dry_run)
        return Progress(
            elapsed_s=now - self.start,
            chunks=health.counts["chunks"] - self.chunks0,
            commands=health.counts["commands"] - self.commands0,
            last_inference_ms=health.last_inference_s * 1e3,
            state=state,
            waiting_for=why,
        )


def goal_state(loop: PolicyLoop, now: float, dry_run: bool) -> tuple[str, str]:
    """(waiting | inferring | executing | holding, what it waits for or why it holds)."""
    if not loop.active:
        return WAITING, loop.waiting_for(now)
    state = loop.executor.state
    if state is ExecState.ESTOPPED:
        return HOLDING, "e-stop engaged"
    if state is ExecState.PAUSED:
        return HOLDING, "paused (~/resume continues)"
    if state is ExecState.STALE_INPUT:
        return WAITING, loop.waiting_for(now) or "fresh inputs"
    if state is ExecState.IDLE:
        return INFERRING, "the first chunk"
    if dry_run:
        return HOLDING, "dry run: chunks only, no commands (robot.dry_run)"
    return EXECUTING, ""


class RunPolicyServer:
    """The RunPolicy ActionServer of a PolicyNode (created at configure, destroyed at cleanup)."""

    def __init__(self, node: Any, loop: PolicyLoop, name: str, dry_run: bool, feedback_period_s: float) -> None:
        from rclpy.action import ActionServer, CancelResponse, GoalResponse

        from omni_ros.action import RunPolicy

        self._node, self._loop, self._dry_run = node, loop, dry_run
        self._goal: GoalRun | None = None
        self._handle: Any = None
        self._done: Any = None  # rclpy Future of the running goal, resolved when it ends
        self._success_sub: Any = None
        self._server = ActionServer(
            node,
            RunPolicy,
            name,
            execute_callback=self._execute,
            goal_callback=lambda _goal: GoalResponse.ACCEPT,
            handle_accepted_callback=self._accepted,
            cancel_callback=self._cancel,
        )
        self._accept, self._reject = CancelResponse.ACCEPT, CancelResponse.REJECT
        self._check_timer = node.create_timer(1.0 / CHECK_HZ, self._check)
        self._feedback_timer = node.create_timer(feedback_period_s, self.publish_feedback)

    def destroy(self) -> None:
        self._end(ABORTED, "the policy node is shutting down")
        self._node.destroy_timer(self._check_timer)
        self._node.destroy_timer(self._feedback_timer)
        self._drop_success_sub()
        self._server.destroy()

    # -- callbacks (executor thread) ---------------------------------------------------------------------------

    def _accepted(self, handle: Any) -> None:
        # One goal at a time: the new one preempts (the old one ends canceled, the robot holding meanwhile).
        self._end(CANCELED, "preempted by a new goal")
        handle.execute()

    def _cancel(self, handle: Any) -> Any:
        if handle is not self._handle or self._goal is None or self._goal.outcome:
            return self._reject  # already ended (or preempted): nothing to cancel
        # Hold before the acceptance goes out, so no command follows the acknowledgement.
        self._end(CANCELED, "cancel requested")
        return self._accept

    async def _execute(self, handle: Any) -> Any:
        from rclpy.task import Future

        from omni_ros.action import RunPolicy

        goal = handle.request
        now = self._node.get_clock().now().nanoseconds * 1e-9
        health = self._loop.counters.health(now)
        run = GoalRun(goal.prompt, float(goal.max_duration_s), now, health.counts["chunks"], health.counts["commands"])
        done: Future = Future()
        self._goal, self._handle, self._done = run, handle, done
        self._drop_success_sub()
        if goal.success_topic:
            from std_msgs.msg import Bool

            self._success_sub = self._node.create_subscription(
                Bool, goal.success_topic, lambda m, r=run: self._on_success(r, bool(m.data)), 10
            )
        if not goal.max_duration_s >= 0:
            self._end(ABORTED, f"max_duration_s must be >= 0, got {goal.max_duration_s}")
        elif self._loop.executor.state is ExecState.ESTOPPED:
            self._end(ABORTED, "e-stop is engaged; release it (and ~/resume) first")
        else:
            self._loop.start_task(goal.prompt)
        await done
        progress = run.progress(self._loop, run.end, self._dry_run)
        if self._goal is run:
            self._drop_success_sub()
        result = RunPolicy.Result(
            outcome=run.outcome,
            reason=run.reason,
            duration_s=run.end - run.start,
            chunks=max(progress.chunks, 0),
            commands=max(progress.commands, 0),
        )
        if run.outcome == SUCCEEDED:
            handle.succeed()
        elif run.outcome == CANCELED and handle.is_cancel_requested:
            handle.canceled()
        else:
            # A preempted goal was never asked to cancel, and the action state machine only lets a goal that
            # was asked end CANCELED: it ends ABORTED, its result saying canceled (preempted).
            handle.abort()
        return result

    def _on_success(self, run: GoalRun, value: bool) -> None:
        if value and run is self._goal:
            self._end(SUCCEEDED, "the success topic said true")

    def on_estop(self, engaged: bool) -> None:
        """The node's e-stop callback: the executor already holds; the goal fails."""
        if engaged:
            self._end(ABORTED, "e-stop engaged")

    def on_controller_failure(self, reason: str) -> None:
        """The controller rejected or aborted a trajectory (the loop already holds): the goal fails."""
        self._end(ABORTED, f"controller failure: {reason}")

    def _check(self) -> None:
        run = self._goal
        if run is not None and not run.outcome and run.timed_out(self._now()):
            self._end(TIMED_OUT, f"no success within max_duration_s {run.max_duration_s:g} s")

    def publish_feedback(self) -> None:
        from omni_ros.action import RunPolicy

        run, handle = self._goal, self._handle
        if run is None or run.outcome or handle is None or not handle.is_active:
            return
        p = run.progress(self._loop, self._now(), self._dry_run)
        handle.publish_feedback(
            RunPolicy.Feedback(
                elapsed_s=p.elapsed_s,
                chunks=max(p.chunks, 0),
                commands=max(p.commands, 0),
                last_inference_ms=p.last_inference_ms,
                state=p.state,
                waiting_for=p.waiting_for,
            )
        )

    # -- helpers -----------------------------------------------------------------------------------------------

    def _now(self) -> float:
        return self._node.get_clock().now().nanoseconds * 1e-9

    def _end(self, outcome: str, reason: str) -> None:
        run, done = self._goal, self._done
        if run is None or done is None or not run.finish(outcome, reason, self._now()):
            return
        self._loop.hold()  # every end holds: after success too, the task is done
        self._node.get_logger().info(f"RunPolicy goal '{run.prompt}': {outcome} ({reason})")
        done.set_result(outcome)

    def _drop_success_sub(self) -> None:
        if self._success_sub is not None:
            self._node.destroy_subscription(self._success_sub)
            self._success_sub = None
