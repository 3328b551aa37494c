"""The policy node: cameras + joint states + prompt in, action chunks and smooth commands out.

A managed (lifecycle) node, thin by design: messages go to a `PolicyLoop` (assembler, policy, executor,
the inference and control threads; see policy_loop.py) and what it produces goes out through the builders
in messages.py. Chunks and commands use lifecycle publishers, so nothing reaches the robot unless the node
is active; status and diagnostics are plain publishers, reporting in every state.

    configure  -> load the policy, create topics, services and the control loop
    activate   -> commands may flow (unless dry_run)
    deactivate -> hold: no commands, chunks dropped
    cleanup    -> release everything
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.lifecycle import Node as LifecycleNode
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from omni_ros import cpu_idle
from omni_ros.config import OmniConfig
from omni_ros.control.executor import check_rtc_support, rtc_method
from omni_ros.msg import ActionChunk, PolicyStatus
from omni_ros.nodes import messages
from omni_ros.nodes.policy_loop import Chunk, PolicyLoop
from omni_ros.policy.base import Policy

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
# A reader that joins late can miss a latched message (eProsima/Fast-DDS#3822: 5-10% of late joiners in its
# reproducer; seen here once in about 20 test runs as a policy node that never got the simulator's prompt and held
# the arm). While the node holds no prompt and the prompt topic has a publisher, it subscribes again every this
# many seconds: a new reader is sent the publisher's latched prompt afresh.
PROMPT_RESUBSCRIBE_S = 5.0


class PolicyNode(LifecycleNode):
    def __init__(
        self, config: OmniConfig, policy: Policy | None = None, node_name: str = "omni_ros_policy", **node_kwargs: Any
    ) -> None:
        super().__init__(node_name, **node_kwargs)
        self.config = config
        self.policy = policy
        self.loop: PolicyLoop | None = None
        self._input_subs: list[Any] = []
        self._trigger_srvs: list[Any] = []
        self._chunk_pub: Any = None
        self._commands: Any = None  # the robot.command_interface (command_interfaces.py)
        self._failures: list[str] = []  # controller failures, handed from the client's callbacks to a timer
        self._failure_timer: Any = None
        self._status_pub: Any = None
        self._diag_pub: Any = None
        self._status_timer: Any = None
        self._run_policy: Any = None
        self._prompt_sub: Any = None
        self._prompt_timer: Any = None
        self._prompt_subscribed_at = 0.0
        self.prompt_resubscribes = 0  # times the prompt was subscribed again (PROMPT_RESUBSCRIBE_S)

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def on_configure(self, state: State) -> TransitionCallbackReturn:
        cfg = self.config
        joints = cfg.robot.joint_names
        try:
            if self.policy is None:
                from omni_ros.backends.factory import load_policy

                self.policy = load_policy(
                    cfg.policy,
                    camera_names=[c.name for c in cfg.topics.cameras],
                    state_dim=len(joints),
                    action_dim=len(joints),
                    control_loop=True,
                    rtc_method=rtc_method(cfg.control),
                )
            meta = self.policy.metadata
            if meta.action_dim != len(joints) or meta.state_dim != len(joints):
                raise ValueError(
                    f"policy has state_dim {meta.state_dim} / action_dim {meta.action_dim} but robot.joint_names "
                    f"lists {len(joints)} joints"
                )
            # blending rtc with a backend that cannot continue a chunk: refused here, not mid-motion.
            check_rtc_support(cfg.control, self.policy)
        except Exception as exc:  # a bad checkpoint must not kill the process: report and stay unconfigured
            self.get_logger().error(f"cannot load policy: {exc}")
            return TransitionCallbackReturn.FAILURE

        loop = self.loop = PolicyLoop(
            cfg, self.policy, self._now, self._publish_chunk, self._publish_command, self.get_logger(), self._halt
        )
        topics = cfg.topics
        for cam in topics.cameras:
            self._input_subs.append(
                self.create_subscription(
                    CompressedImage if cam.compressed else Image,
                    cam.topic,
                    lambda m, n=cam.name, c=cam.compressed: loop.image(n, m, c),
                    qos_profile_sensor_data,
                )
            )
        self._input_subs += [
            self.create_subscription(JointState, topics.joint_states, loop.joint_state, qos_profile_sensor_data),
            self.create_subscription(Bool, topics.estop, lambda m: self._on_estop(bool(m.data)), 10),
        ]
        self._subscribe_prompt()
        self._prompt_timer = self.create_timer(1.0, self._watch_prompt)
        self._trigger_srvs = [
            self.create_service(Trigger, "~/pause", lambda _, r: _answer(r, *loop.pause())),
            self.create_service(Trigger, "~/resume", lambda _, r: _answer(r, *loop.resume())),
        ]
        self._chunk_pub = self.create_lifecycle_publisher(ActionChunk, topics.action_chunk, 10)
        from omni_ros.nodes import command_interfaces

        self._commands = command_interfaces.make(self, cfg, loop, self._controller_failed)
        self._failure_timer = self.create_timer(0.05, self._handle_failures)
        self._status_pub = self.create_publisher(PolicyStatus, cfg.status.topic, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, topics.diagnostics, 10)
        from omni_ros.nodes.run_policy import RunPolicyServer

        self._run_policy = RunPolicyServer(self, loop, topics.run_policy, cfg.robot.dry_run, 1.0 / cfg.status.rate_hz)
        loop.start()
        self._status_timer = self.create_timer(1.0 / cfg.status.rate_hz, self.publish_status)
        meta = self.policy.metadata
        self.get_logger().info(
            f"configured: policy {meta.model} on {meta.backend} ({meta.precision or 'fp32'}), "
            f"cameras {list(meta.camera_names)}, joints {joints}, "
            f"{cfg.robot.control_rate_hz:g} Hz, dry_run={cfg.robot.dry_run}; "
            f"cpu idle polling while inferring {cpu_idle.status().describe()}"
        )
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        result = super().on_activate(state)  # enables the lifecycle publishers
        if self.loop is not None:
            self.loop.activate()
        self.get_logger().info("active" + (" (dry run: chunks only, no commands)" if self.config.robot.dry_run else ""))
        return result

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        if self.loop is not None:
            self.loop.deactivate()
        self.get_logger().info("deactivated: holding, no commands")
        return super().on_deactivate(state)

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        self._release(wait=False)
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        self._release(wait=False)
        return TransitionCallbackReturn.SUCCESS

    def destroy_node(self) -> None:
        # Stop the control and inference threads before the entities they use go away.
        self.shutdown_now()
        super().destroy_node()

    def shutdown_now(self) -> None:
        """Stop commands, the control loop and the inference thread before the node is destroyed."""
        self._release(wait=True)

    def _release(self, wait: bool) -> None:
        if self._run_policy is not None:
            self._run_policy.destroy()  # its goal ends aborted, the robot holding
            self._run_policy = None
        if self.loop is not None:
            self.loop.close(wait=wait)
            self.loop = None
        for timer in (self._status_timer, self._failure_timer, self._prompt_timer):
            if timer is not None:
                self.destroy_timer(timer)
        self._status_timer = self._failure_timer = self._prompt_timer = None
        if self._prompt_sub is not None:
            self.destroy_subscription(self._prompt_sub)
            self._prompt_sub = None
        if self._commands is not None:
            self._commands.destroy()
            self._commands = None
        for sub in self._input_subs:
            self.destroy_subscription(sub)
        for srv in self._trigger_srvs:
            self.destroy_service(srv)
        self._input_subs, self._trigger_srvs = [], []
        if self._chunk_pub is not None:
            self.destroy_lifecycle_publisher(self._chunk_pub)
        for pub in (self._status_pub, self._diag_pub):
            if pub is not None:
                self.destroy_publisher(pub)
        self._chunk_pub = self._status_pub = self._diag_pub = None

    def _subscribe_prompt(self) -> None:
        assert self.loop is not None  # configured
        self._prompt_sub = self.create_subscription(String, self.config.topics.prompt, self.loop.prompt, LATCHED)
        self._prompt_subscribed_at = time.monotonic()

    def _watch_prompt(self) -> None:
        """Subscribe to the prompt again while none came and the topic has a publisher (PROMPT_RESUBSCRIBE_S)."""
        loop, topic = self.loop, self.config.topics.prompt
        if loop is None or self._prompt_sub is None or loop.assembler.has_prompt():
            return
        if time.monotonic() - self._prompt_subscribed_at < PROMPT_RESUBSCRIBE_S:
            return
        publishers = self.count_publishers(topic)
        if publishers == 0:
            return  # nothing to miss: the status already says no prompt yet
        self.prompt_resubscribes += 1
        say = self.get_logger().warning if self.prompt_resubscribes == 1 else self.get_logger().debug
        say(
            f"no prompt from the {publishers} publisher(s) of {topic} in {PROMPT_RESUBSCRIBE_S:g} s: subscribing "
            "again (a reader that joins late can miss a latched message); if this repeats, the publisher may be "
            "volatile or not have published yet: publish the prompt (transient-local) or send a RunPolicy goal"
        )
        self.destroy_subscription(self._prompt_sub)
        self._subscribe_prompt()

    def _on_estop(self, engaged: bool) -> None:
        if self.loop is not None:
            self.loop.set_estop(engaged)
        if self._run_policy is not None:
            self._run_policy.on_estop(engaged)

    # -- outputs -----------------------------------------------------------------------------------------------

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _publish_chunk(self, chunk: Chunk) -> None:
        pub, policy = self._chunk_pub, self.policy
        # An inference still running at shutdown finishes after the context is gone: nothing left to tell.
        if pub is not None and policy is not None and self.context.ok():
            joints, backend = self.config.robot.joint_names, policy.metadata.backend
            c = chunk
            pub.publish(messages.action_chunk(c.chunk_id, joints, c.actions, c.stamp, c.dt, c.inference_s, backend))

    def _publish_command(self, positions: np.ndarray, now: float) -> None:
        commands = self._commands
        if commands is not None:
            commands.send(positions, now)

    def _halt(self) -> None:
        commands = self._commands
        if commands is not None:
            commands.halt()

    def _controller_failed(self, reason: str) -> None:
        # The action client's callback thread: stop at once (the executor's pause takes only its own lock), and
        # leave the RunPolicy goal to the timer, outside the client's callback.
        if self.loop is not None:
            self.loop.controller_failed(reason)
        self._failures.append(reason)

    def _handle_failures(self) -> None:
        while self._failures:
            reason = self._failures.pop(0)
            if self._run_policy is not None:
                self._run_policy.on_controller_failure(reason)

    def publish_status(self) -> PolicyStatus | None:
        loop, policy = self.loop, self.policy
        if loop is None or policy is None:
            return None
        now = self._now()
        health = loop.counters.health(now)
        code, detail = messages.policy_state(
            loop.executor.state,
            active=loop.active,
            consecutive_errors=health.consecutive_errors,
            last_error=health.last_error,
            exec_reason=loop.exec_reason,
            dry_run=self.config.robot.dry_run,
            controller_error=loop.controller_error,
            keeping_up=loop.executor.keeping_up(),
        )
        msg = messages.policy_status(
            now,
            code,
            detail,
            backend=policy.metadata.backend,
            model=policy.metadata.model,
            last_inference_s=health.last_inference_s,
            control_rate=self.config.robot.control_rate_hz,
            achieved_rate=health.achieved_rate,
            dry_run=self.config.robot.dry_run,
            counts=health.counts,
            precision=policy.metadata.precision,
        )
        if self._status_pub is not None and self._diag_pub is not None:
            self._status_pub.publish(msg)
            motion = loop.executor.motion_counts(now)
            self._diag_pub.publish(messages.diagnostics(msg, f"{self.get_name()}: policy", motion))
        return msg


def _answer(response: Trigger.Response, success: bool, message: str) -> Trigger.Response:
    response.success, response.message = success, message
    return response


def main(argv: list[str] | None = None) -> int:
    """Run the policy node alone: `python -m omni_ros.nodes.policy_node [--config FILE] [--no-activate]`."""
    import argparse
    import sys

    from omni_ros.commands.common import add_precision_args, apply_precision_args
    from omni_ros.config import ConfigError, load_config
    from omni_ros.ros_env import run_node

    parser = argparse.ArgumentParser(prog="policy_node", description="omni_ros policy node (lifecycle)")
    parser.add_argument("--config", help="omni_ros YAML config")
    parser.add_argument("--sim", action="store_true", help="drive the simulated robot (dry_run off)")
    parser.add_argument("--no-activate", action="store_true", help="stay unconfigured for a lifecycle manager")
    add_precision_args(parser)
    args, ros_args = parser.parse_known_args(argv)
    try:
        config: OmniConfig = load_config(args.config)
        apply_precision_args(config, args)
    except ConfigError as exc:
        print(f"policy_node: config error: {exc}", file=sys.stderr)
        return 2
    if args.sim:
        config.robot.dry_run = False
    from omni_ros import cpu_threads

    cpu_threads.configure(config.policy)
    return run_node("policy_node", lambda: PolicyNode(config), ros_args, (), activate=not args.no_activate)


if __name__ == "__main__":
    raise SystemExit(main())
