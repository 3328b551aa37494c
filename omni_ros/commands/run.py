"""`omni-ros run PROMPT`: send one RunPolicy goal to a running policy node and follow it to its end.

The command-line client of omni_ros/action/RunPolicy for set-ups without the `ros2` CLI (the pip wheels); on a
full ROS install `ros2 action send_goal /omni_ros/run_policy omni_ros/action/RunPolicy "{prompt: ...}"` does
the same. Feedback is printed as it arrives; Ctrl-C cancels the goal (the robot holds) and waits for its result.
Exit status 0 when the goal succeeded, 1 for any other outcome, 2 when no policy node serves the action.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any


def run(args: argparse.Namespace) -> int:
    import rclpy
    from rclpy.action import ActionClient
    from rclpy.executors import SingleThreadedExecutor

    from omni_ros.action import RunPolicy
    from omni_ros.ros_env import default_to_localhost

    default_to_localhost()
    from rclpy.signals import SignalHandlerOptions

    context = rclpy.Context()
    # No rclpy SIGINT handler: it would shut the context down before the cancel could go out.
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("omni_ros_run", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    client: Any = ActionClient(node, RunPolicy, args.action)

    # Ctrl-C only sets a flag, read between spins: a KeyboardInterrupt raised wherever the signal lands (inside
    # rclpy's C++ converting a reply, say) came out as a cast error with a traceback, and the goal ran on.
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops waiting for the cancel

    signal.signal(signal.SIGINT, on_sigint)

    def spin_until(done: Any, timeout: float, interruptible: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            if interruptible and interrupted.is_set():
                raise KeyboardInterrupt
            executor.spin_once(timeout_sec=0.05)
        return bool(done())

    def feedback(msg: Any) -> None:
        f = msg.feedback
        why = f" ({f.waiting_for})" if f.waiting_for else ""
        print(
            f"[{f.elapsed_s:6.1f} s] {f.state}{why}: chunks {f.chunks}, commands {f.commands}, "
            f"last inference {f.last_inference_ms:.0f} ms",
            flush=True,
        )

    sent: Any = None
    handle: Any = None
    result: Any = None
    try:
        try:
            if not spin_until(client.server_is_ready, args.wait):
                print(f"omni-ros run: no policy node serves {args.action} (waited {args.wait:g} s)", file=sys.stderr)
                return 2
            goal = RunPolicy.Goal(
                prompt=args.prompt, max_duration_s=args.max_duration, success_topic=args.success_topic
            )
            sent = client.send_goal_async(goal, feedback_callback=feedback)
            spin_until(sent.done, args.wait)
            handle = sent.result() if sent.done() else None
            if handle is None or not handle.accepted:
                print("omni-ros run: the goal was not accepted", file=sys.stderr)
                return 1
            result = handle.get_result_async()
            spin_until(result.done, float("inf"))
        except KeyboardInterrupt:
            # Whenever Ctrl-C comes, a goal that was sent is cancelled: the robot must not keep running it.
            print("omni-ros run: cancelling (the robot holds)", flush=True)
            if handle is None and sent is not None and spin_until(sent.done, args.wait, interruptible=False):
                handle = sent.result()
            if handle is None or not handle.accepted:
                return 130
            cancel = handle.cancel_goal_async()
            spin_until(cancel.done, args.wait, interruptible=False)
            result = result or handle.get_result_async()
            spin_until(result.done, args.wait, interruptible=False)
        response = result.result() if result is not None and result.done() else None
        if response is None:
            print("omni-ros run: no result from the policy node", file=sys.stderr)
            return 1
        r = response.result
        print(f"outcome: {r.outcome} ({r.reason}); {r.duration_s:.1f} s, chunks {r.chunks}, commands {r.commands}")
        return 0 if r.outcome == RunPolicy.Result.OUTCOME_SUCCEEDED else 1
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        client.destroy()
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="send a RunPolicy goal (a task prompt) to a running policy node and follow it: feedback as it comes, "
        "Ctrl-C cancels; exit 0 only when it succeeded",
    )
    p.add_argument("prompt", help="the task prompt")
    p.add_argument("--max-duration", type=float, default=0.0, help="give up after this many seconds (0: never)")
    p.add_argument("--success-topic", default="", help="std_msgs/Bool topic whose true ends the goal with success")
    p.add_argument("--action", default="/omni_ros/run_policy", help="the action name (topics.run_policy)")
    p.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the server and answers")
    p.set_defaults(func=run)
