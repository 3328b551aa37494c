"""Process-wide ROS 2 settings that must be in place before rclpy starts."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any


def default_to_localhost() -> None:
    """Keep DDS discovery on this machine unless the user chose otherwise.

    Fast DDS multicasts to the whole subnet by default; a robot that talks to
    other machines sets ROS_AUTOMATIC_DISCOVERY_RANGE=SUBNET explicitly.
    """
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")


# Which rclpy executor spins our nodes: "events" (rclpy's EventsExecutor: a C++ event queue) or "single" (the
# SingleThreadedExecutor). The events one is the default: the single one rebuilds its wait set in Python at every
# wake-up (a lifecycle node has dozens of services, publishers and QoS event handlers), so each camera frame and
# joint state took the GIL away from the inference thread; with the events one a live full-size SmolVLA's chunks
# came sooner and the simulator's node used less CPU (bench/results/realtime.json, `live_by_executor`).
EXECUTOR_ENV = "OMNI_ROS_EXECUTOR"
EXECUTORS = ("events", "single")


def executor_choice() -> str:
    """The executor `$OMNI_ROS_EXECUTOR` names (default events); ValueError for another name. Checked before a
    node loads its policy, so a typo fails in a second, not after the load."""
    choice = os.environ.get(EXECUTOR_ENV, "").strip().lower() or EXECUTORS[0]
    if choice not in EXECUTORS:
        raise ValueError(f"${EXECUTOR_ENV} must be one of {', '.join(EXECUTORS)}, got {choice!r}")
    return choice


def executor_usable(prog: str) -> bool:
    """Whether `$OMNI_ROS_EXECUTOR` names an executor; if not, one line on stderr saying why (the caller exits
    with status 2 before any node loads its policy)."""
    try:
        executor_choice()
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return False
    return True


def make_executor() -> Any:
    """The executor `executor_choice()` names (an rclpy without the events one gets the single one)."""
    if executor_choice() == "events":
        try:
            from rclpy.experimental import EventsExecutor
        except ImportError:  # rclpy before Jazzy
            pass
        else:
            return EventsExecutor()
    from rclpy.executors import SingleThreadedExecutor

    return SingleThreadedExecutor()


def shutdown_executor(executor: Any, timeout: float = 5.0) -> None:
    """Let callbacks already handed to worker threads finish, then shut the executor down.

    rclpy's MultiThreadedExecutor.shutdown destroys its guard condition without
    waiting for running callbacks, which then fail on it at exit ("The
    following exception was never retrieved: cannot use Destroyable ...").
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(not task.done() for task in list(getattr(executor, "_futures", []))):
        time.sleep(0.01)
    executor.shutdown()


def spin_until_shutdown(node: Any, executor: Any = None, duration: float = 0.0) -> None:
    """Spin `node` until Ctrl-C, an external shutdown or `duration` seconds (0: no limit); then clean up.

    The one way every `python -m omni_ros.nodes.X` entry point runs, so each
    stops the same way.
    """
    import rclpy
    from rclpy.executors import ExternalShutdownException

    executor = executor or make_executor()
    executor.add_node(node)
    deadline = time.monotonic() + duration if duration > 0 else float("inf")
    try:
        while rclpy.ok() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        # Ctrl-C / SIGTERM shuts the context down under a callback that is publishing ("publisher's context
        # is invalid"): that is the shutdown arriving, not a failure of the node (it made a clean stop exit 1).
        if rclpy.ok():
            raise
    finally:
        shutdown_executor(executor)
        node.destroy_node()
        rclpy.try_shutdown()


def run_node(
    prog: str,
    make_node: Callable[[], Any],
    ros_args: list[str],
    errors: tuple[type[BaseException], ...],
    *,
    activate: bool = False,
    duration: float = 0.0,
) -> int:
    """Start rclpy, build a node and spin it until shutdown or `duration` seconds (0: no limit).

    The one runner of every `python -m omni_ros.nodes.X`. A construction error in `errors` is one line and
    exit status 2. `activate`: a lifecycle node is configured and activated first (without it, a lifecycle
    node waits unconfigured for a manager); a refused transition is exit status 1.
    """
    import rclpy

    default_to_localhost()
    if not executor_usable(prog):
        return 2
    rclpy.init(args=[prog, *ros_args])
    try:
        node = make_node()
    except errors as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    if activate:
        from rclpy.lifecycle import TransitionCallbackReturn

        ok = TransitionCallbackReturn.SUCCESS
        if node.trigger_configure() != ok or node.trigger_activate() != ok:
            print(f"{prog}: the node could not start (see the log above)", file=sys.stderr)
            node.destroy_node()
            rclpy.try_shutdown()
            return 1
    spin_until_shutdown(node, duration=duration)
    return 0
