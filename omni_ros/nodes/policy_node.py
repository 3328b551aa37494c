"""The policy node: cameras + joint states + prompt in, action chunks and smooth commands out.

A managed (lifecycle) node. It converts messages at the edge and hands them to
the plain-Python pieces every entry point shares: `ObservationAssembler`
(latest inputs, staleness), a `Policy` (any backend), and the
`ActionChunkExecutor` (prefetch, latency compensation, blending, limits,
safety states). Inference runs on its own thread and the control loop on
another, paced by the monotonic clock, so neither callbacks nor the model
can delay a command tick.

    configure  -> load the policy, create topics, services and timers
    activate   -> commands may flow (unless dry_run)
    deactivate -> hold: no commands, chunks dropped
    cleanup    -> release everything
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.lifecycle import Node as LifecycleNode
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from omni_ros.assembler import ObservationAssembler, StaleInput
from omni_ros.config import OmniConfig
from omni_ros.control.executor import ActionChunkExecutor, ExecState
from omni_ros.msg import ActionChunk, PolicyStatus
from omni_ros.policy.base import Policy
from omni_ros.ros_convert import ImageError, compressed_to_rgb, image_to_rgb, sec_to_stamp, stamp_to_sec

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)

STATUS_CODES = {
    ExecState.IDLE: PolicyStatus.IDLE,
    ExecState.RUNNING: PolicyStatus.RUNNING,
    ExecState.STALE_INPUT: PolicyStatus.STALE_INPUT,
    ExecState.PAUSED: PolicyStatus.PAUSED,
    ExecState.ESTOPPED: PolicyStatus.ESTOPPED,
}
STATUS_NAMES = {
    PolicyStatus.IDLE: "idle",
    PolicyStatus.RUNNING: "running",
    PolicyStatus.STALE_INPUT: "stale-input",
    PolicyStatus.PAUSED: "paused",
    PolicyStatus.ESTOPPED: "e-stopped",
    PolicyStatus.ERROR: "error",
}
# Consecutive inference failures after which the node reports ERROR (it keeps retrying).
ERROR_AFTER = 3


class PolicyNode(LifecycleNode):
    def __init__(
        self, config: OmniConfig, policy: Policy | None = None, node_name: str = "omni_ros_policy", **node_kwargs: Any
    ) -> None:
        super().__init__(node_name, **node_kwargs)
        self.config = config
        self.policy = policy
        self.assembler: ObservationAssembler | None = None
        self.executor_: ActionChunkExecutor | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._active = False
        self._handles: list[Any] = []
        self._chunk_id = 0
        self._consecutive_errors = 0
        self._last_error = ""
        self._last_inference_s = 0.0
        self._camera_errors: dict[str, str] = {}
        self.counters = {"chunks": 0, "commands": 0, "dropped_frames": 0, "errors": 0}
        self._rate_window: list[float] = []
        self._exec_reason = ""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def on_configure(self, state: State) -> TransitionCallbackReturn:
        cfg = self.config
        joints = cfg.robot.joint_names
        try:
            if self.policy is None:
                from omni_ros.policy.factory import load_policy

                self.policy = load_policy(
                    cfg.policy,
                    camera_names=[c.name for c in cfg.topics.cameras],
                    state_dim=len(joints),
                    action_dim=len(joints),
                )
            meta = self.policy.metadata
            if meta.action_dim != len(joints) or meta.state_dim != len(joints):
                raise ValueError(
                    f"policy has state_dim {meta.state_dim} / action_dim {meta.action_dim} but robot.joint_names "
                    f"lists {len(joints)} joints"
                )
        except Exception as exc:  # a bad checkpoint must not kill the process: report and stay unconfigured
            self.get_logger().error(f"cannot load policy: {exc}")
            self._last_error = str(exc)
            return TransitionCallbackReturn.FAILURE

        control = cfg.control
        self.assembler = ObservationAssembler(
            [c.name for c in cfg.topics.cameras],
            joints,
            camera_stale_s=control.camera_stale_s,
            state_stale_s=control.state_stale_s,
            prompt_stale_s=control.prompt_stale_s,
            default_prompt=cfg.topics.default_prompt,
        )
        self.executor_ = ActionChunkExecutor(len(joints), control, cfg.robot.control_rate_hz, cfg.robot.dry_run)
        # Commands wait for activation.
        self.executor_.pause()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inference")

        topics = cfg.topics
        for cam in topics.cameras:
            msg_type = CompressedImage if cam.compressed else Image
            self._handles.append(
                self.create_subscription(
                    msg_type,
                    cam.topic,
                    lambda m, n=cam.name: self._on_image(n, m),
                    qos_profile_sensor_data,
                )
            )
        self._handles += [
            self.create_subscription(JointState, topics.joint_states, self._on_joint_state, qos_profile_sensor_data),
            self.create_subscription(String, topics.prompt, self._on_prompt, LATCHED),
            self.create_subscription(Bool, topics.estop, self._on_estop, 10),
            self.create_service(Trigger, "~/pause", self._on_pause),
            self.create_service(Trigger, "~/resume", self._on_resume),
        ]
        self._chunk_pub = self.create_publisher(ActionChunk, topics.action_chunk, 10)
        self._command_pub = self.create_publisher(JointTrajectory, control.command_topic, 10)
        self._forward_pub = (
            self.create_publisher(Float64MultiArray, topics.forward_command, 10) if topics.forward_command else None
        )
        self._status_pub = self.create_publisher(PolicyStatus, cfg.status.topic, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, topics.diagnostics, 10)
        # The control loop is a thread of its own, paced by the monotonic clock: no executor scheduling or
        # other callback (image conversion, status) can delay a command tick.
        self._control_stop = threading.Event()
        self._control_thread = threading.Thread(target=self._control_loop, name="control", daemon=True)
        self._control_thread.start()
        self._status_timer = self.create_timer(1.0 / cfg.status.rate_hz, self.publish_status)
        meta = self.policy.metadata
        self.get_logger().info(
            f"configured: policy {meta.model} on {meta.backend}, cameras {list(meta.camera_names)}, joints {joints}, "
            f"{cfg.robot.control_rate_hz:g} Hz, dry_run={cfg.robot.dry_run}"
        )
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self._active = True
        self.executor_.resume()
        self.get_logger().info("active" + (" (dry run: chunks only, no commands)" if self.config.robot.dry_run else ""))
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        self._active = False
        self.executor_.pause()
        self.get_logger().info("deactivated: holding, no commands")
        return super().on_deactivate(state)

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        self._active = False
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def destroy_node(self) -> None:
        # Stop the control and inference threads before the entities they use go away.
        self.shutdown_now()
        super().destroy_node()

    def shutdown_now(self) -> None:
        """Stop commands, the control loop and the inference thread before the node is destroyed."""
        self._active = False
        self._stop_control_loop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._release()

    def _stop_control_loop(self) -> None:
        if getattr(self, "_control_thread", None) is not None:
            self._control_stop.set()
            self._control_thread.join(timeout=2.0)
            self._control_thread = None

    def _release(self) -> None:
        self._stop_control_loop()
        if getattr(self, "_status_timer", None) is not None:
            self.destroy_timer(self._status_timer)
        self._status_timer = None
        for handle in self._handles:
            if hasattr(handle, "srv_type"):
                self.destroy_service(handle)
            else:
                self.destroy_subscription(handle)
        self._handles = []
        for name in ("_chunk_pub", "_command_pub", "_forward_pub", "_status_pub", "_diag_pub"):
            pub = getattr(self, name, None)
            if pub is not None:
                self.destroy_publisher(pub)
            setattr(self, name, None)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # -- inputs ------------------------------------------------------------------------------------------------

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _stamp_or_now(self, header: Any) -> float:
        stamp = stamp_to_sec(header.stamp)
        return stamp if stamp > 0 else self._now()

    def _on_image(self, camera: str, msg: Image | CompressedImage) -> None:
        try:
            rgb = compressed_to_rgb(msg) if isinstance(msg, CompressedImage) else image_to_rgb(msg)
        except ImageError as exc:
            self.counters["dropped_frames"] += 1
            if self._camera_errors.get(camera) != str(exc):
                self.get_logger().warning(f"camera '{camera}': frame dropped: {exc}")
            self._camera_errors[camera] = str(exc)
            return
        self._camera_errors.pop(camera, None)
        if not self.assembler.add_image(camera, rgb, self._stamp_or_now(msg.header)):
            self.counters["dropped_frames"] += 1

    def _on_joint_state(self, msg: JointState) -> None:
        stamp = self._stamp_or_now(msg.header)
        if self.assembler.add_joint_state(list(msg.name), list(msg.position), stamp):
            self.executor_.observe_position(self.assembler.latest_state())

    def _on_prompt(self, msg: String) -> None:
        self.assembler.add_prompt(msg.data, self._now())
        # A new task (or a new episode in the sim): the old plan answers the old prompt.
        self.executor_.reset_plan()
        self.get_logger().info(f"prompt: '{msg.data.strip()}'")

    def _on_estop(self, msg: Bool) -> None:
        self.executor_.set_estop(bool(msg.data))
        self.get_logger().warning("E-STOP engaged" if msg.data else "e-stop released; call ~/resume to continue")

    def _on_pause(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.executor_.pause()
        response.success, response.message = True, "paused"
        return response

    def _on_resume(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.executor_.state is ExecState.ESTOPPED:
            response.success, response.message = False, "e-stop is engaged; release it first"
        elif not self._active:
            response.success, response.message = False, "node is not active"
        else:
            self.executor_.resume()
            response.success, response.message = True, "resumed"
        return response

    # -- control loop ------------------------------------------------------------------------------------------

    def _control_loop(self) -> None:
        period = 1.0 / self.config.robot.control_rate_hz
        next_tick = time.monotonic()
        while not self._control_stop.is_set():
            try:
                self._on_control_tick()
            except Exception as exc:  # a bug in one tick must not end commands' safety checks for good
                self.get_logger().error(f"control tick failed: {exc}")
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay < 0:  # overran: start again from now rather than firing a burst of late ticks
                next_tick, delay = time.monotonic(), 0.0
            self._control_stop.wait(delay)

    def _on_control_tick(self) -> None:
        now = self._now()
        problem = self.assembler.check(now)
        if problem and problem.startswith(("no frame yet from camera", "camera")):
            camera = problem.split("'")[1] if "'" in problem else ""
            if camera in self._camera_errors:
                problem += f" (last frame rejected: {self._camera_errors[camera]})"
        self.executor_.set_stale(bool(problem), problem)
        if self._active and self.executor_.should_request(now):
            self._start_inference(now)
        command = self.executor_.tick(now)
        self._exec_reason = command.reason
        if command.publish and self._active and command.positions is not None:
            self._publish_command(command.positions, now)

    def _start_inference(self, now: float) -> None:
        try:
            assembled = self.assembler.assemble(now)
        except StaleInput as exc:
            self.executor_.set_stale(True, str(exc))
            return
        request_id = self.executor_.request_started(now)
        future = self._pool.submit(self._infer, assembled.obs)
        future.add_done_callback(lambda f, stamp=assembled.stamp: self._on_chunk(f, stamp, request_id))

    def _infer(self, obs: dict) -> tuple[dict, float]:
        start = time.perf_counter()
        result = self.policy.infer(obs)
        return result, time.perf_counter() - start

    def _on_chunk(self, future: concurrent.futures.Future, stamp: float, request_id: int) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self.counters["errors"] += 1
            self._consecutive_errors += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            self.executor_.request_failed(self._last_error, request_id=request_id)
            self.get_logger().error(f"inference failed: {self._last_error}")
            return
        result, seconds = future.result()
        self._consecutive_errors = 0
        self._last_inference_s = seconds
        actions = np.asarray(result["actions"], dtype=np.float32)
        dt = self.policy.metadata.action_dt
        report = self.executor_.add_chunk(actions, stamp, dt, self._now(), request_id=request_id)
        if not report.accepted:
            self.get_logger().warning(f"chunk {report.chunk_id} not executed: {report.reason}")
        self._publish_chunk(actions, stamp, dt, seconds)

    def _publish_chunk(self, actions: np.ndarray, stamp: float, dt: float, seconds: float) -> None:
        if self._chunk_pub is None:
            return
        msg = ActionChunk()
        sec_to_stamp(stamp, msg.header.stamp)
        msg.chunk_id = self._chunk_id
        msg.joint_names = list(self.config.robot.joint_names)
        msg.horizon, msg.action_dim = int(actions.shape[0]), int(actions.shape[1])
        msg.dt = float(dt)
        msg.actions = actions.ravel().tolist()
        msg.inference_time = float(seconds)
        msg.backend = self.policy.metadata.backend
        self._chunk_pub.publish(msg)
        self._chunk_id += 1
        self.counters["chunks"] += 1

    def _publish_command(self, positions: np.ndarray, now: float) -> None:
        if self._command_pub is None:
            return
        msg = JointTrajectory()
        sec_to_stamp(now, msg.header.stamp)
        msg.joint_names = list(self.config.robot.joint_names)
        point = JointTrajectoryPoint()
        point.positions = positions.astype(float).tolist()
        period = 1.0 / self.config.robot.control_rate_hz
        point.time_from_start.sec, point.time_from_start.nanosec = 0, int(period * 1e9)
        msg.points = [point]
        self._command_pub.publish(msg)
        if self._forward_pub is not None:
            self._forward_pub.publish(Float64MultiArray(data=point.positions))
        self.counters["commands"] += 1
        self._rate_window.append(now)

    # -- status ------------------------------------------------------------------------------------------------

    def current_state(self) -> tuple[int, str]:
        if self.executor_ is None:
            return PolicyStatus.ERROR, self._last_error or "not configured"
        state = self.executor_.state
        if self._consecutive_errors >= ERROR_AFTER:
            return PolicyStatus.ERROR, f"inference failing: {self._last_error}"
        if not self._active and state is ExecState.PAUSED:
            return PolicyStatus.IDLE, "inactive (lifecycle)"
        code = STATUS_CODES[state]
        if state is ExecState.STALE_INPUT:
            detail = self._exec_reason or "stale input"
        elif state is ExecState.IDLE:
            detail = "waiting for the first chunk"
        elif state is ExecState.RUNNING:
            detail = "dry run: chunks only" if self.config.robot.dry_run else "executing"
        else:
            detail = state.value
        return code, detail

    def publish_status(self) -> PolicyStatus:
        now = self._now()
        code, detail = self.current_state()
        window = [t for t in self._rate_window if now - t <= 2.0]
        self._rate_window = window
        msg = PolicyStatus()
        sec_to_stamp(now, msg.header.stamp)
        msg.state, msg.state_name, msg.detail = code, STATUS_NAMES[code], detail
        if self.policy is not None:
            msg.backend, msg.model = self.policy.metadata.backend, self.policy.metadata.model
        msg.last_inference_time = float(self._last_inference_s)
        msg.control_rate = float(self.config.robot.control_rate_hz)
        msg.achieved_rate = float(len(window) / 2.0)
        msg.dry_run = self.config.robot.dry_run
        for key, value in self.counters.items():
            setattr(msg, key, value)
        if self._status_pub is not None:
            self._status_pub.publish(msg)
            self._publish_diagnostics(msg)
        return msg

    def _publish_diagnostics(self, status: PolicyStatus) -> None:
        level = {
            PolicyStatus.RUNNING: DiagnosticStatus.OK,
            PolicyStatus.IDLE: DiagnosticStatus.OK,
            PolicyStatus.PAUSED: DiagnosticStatus.OK,
            PolicyStatus.STALE_INPUT: DiagnosticStatus.WARN,
            PolicyStatus.ESTOPPED: DiagnosticStatus.WARN,
            PolicyStatus.ERROR: DiagnosticStatus.ERROR,
        }[status.state]
        diag = DiagnosticStatus(
            level=level, name=f"{self.get_name()}: policy", message=status.detail, hardware_id=status.backend
        )
        diag.values = [
            KeyValue(key=k, value=str(v))
            for k, v in (
                ("state", status.state_name),
                ("model", status.model),
                ("last_inference_s", f"{status.last_inference_time:.4f}"),
                ("achieved_rate_hz", f"{status.achieved_rate:.1f}"),
                ("dry_run", status.dry_run),
                ("chunks", status.chunks),
                ("commands", status.commands),
                ("dropped_frames", status.dropped_frames),
                ("errors", status.errors),
            )
        ]
        array = DiagnosticArray()
        array.header.stamp = status.header.stamp
        array.status = [diag]
        self._diag_pub.publish(array)


def main(argv: list[str] | None = None) -> int:
    """Run the policy node alone: `python -m omni_ros.nodes.policy_node [--config FILE] [--no-activate]`."""
    import argparse
    import sys

    from omni_ros.config import ConfigError, load_config
    from omni_ros.ros_env import default_to_localhost, spin_until_shutdown

    parser = argparse.ArgumentParser(prog="policy_node", description="omni_ros policy node (lifecycle)")
    parser.add_argument("--config", help="omni_ros YAML config")
    parser.add_argument("--sim", action="store_true", help="drive the simulated robot (dry_run off)")
    parser.add_argument("--no-activate", action="store_true", help="stay unconfigured for a lifecycle manager")
    args, ros_args = parser.parse_known_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"policy_node: config error: {exc}", file=sys.stderr)
        return 2
    if args.sim:
        config.robot.dry_run = False
    from omni_ros import cpu_threads

    cpu_threads.configure(config.policy)
    default_to_localhost()
    import rclpy

    rclpy.init(args=["policy_node", *ros_args])
    node = PolicyNode(config)
    if not args.no_activate:
        if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            node.destroy_node()
            rclpy.try_shutdown()
            return 1
        node.trigger_activate()
    spin_until_shutdown(node)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
