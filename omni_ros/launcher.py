"""`omni-ros up`: start the omni_ros nodes, in one process or one process each.

The Python twin of launch/omni_ros.launch.py for machines without
`launch_ros` (such as a pip-only install): the same nodes, Ctrl-C to stop.
In one process they share one executor and one policy object
(the bridge serves the policy the node runs).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

from omni_ros.config import OmniConfig
from omni_ros.ros_env import default_to_localhost, executor_usable, make_executor, shutdown_executor


def node_names(config: OmniConfig, sim: bool, bridge: bool, tts: bool) -> list[str]:
    names = ["sim"] if sim else []
    names.append("policy")
    if bridge:
        names.append("bridge")
    if tts:
        names.append("tts")
    return names


def run_stack(
    config: OmniConfig,
    sim: bool = False,
    duration: float = 0.0,
    bridge: bool = False,
    tts: bool = False,
    processes: bool = False,
    config_path: str | None = None,
    policy_args: list[str] | None = None,
) -> int:
    """Run the configured nodes until Ctrl-C or `duration` seconds (0 = forever).

    `policy_args` (e.g. `--precision int8`) go to the nodes that load a policy when they run as processes; in one
    process `config` already holds them."""
    default_to_localhost()
    if not executor_usable("omni-ros up"):  # before any node loads its policy
        return 2
    names = node_names(config, sim, bridge, tts)
    if processes:
        return _run_processes(names, sim, duration, config_path, policy_args or [])
    return _run_in_process(config, names, duration)


def _run_in_process(config: OmniConfig, names: list[str], duration: float) -> int:
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from rclpy.lifecycle import TransitionCallbackReturn
    from std_msgs.msg import String

    from omni_ros.msg import PolicyStatus
    from omni_ros.nodes.policy_node import LATCHED, PolicyNode

    rclpy.init(
        args=["omni-ros", "--ros-args", "--disable-external-lib-logs"],
        signal_handler_options=rclpy.signals.SignalHandlerOptions.NO,
    )
    nodes: list[Any] = []
    try:
        if "sim" in names:
            from omni_ros.nodes.sim_robot_node import SimRobotNode

            nodes.append(SimRobotNode(config))
        policy_node = PolicyNode(config)
        nodes.append(policy_node)
        ok = TransitionCallbackReturn.SUCCESS
        if policy_node.trigger_configure() != ok or policy_node.trigger_activate() != ok:
            print("omni-ros up: the policy node could not start (see the log above)", file=sys.stderr)
            return 1
        if "bridge" in names:
            from omni_ros.nodes.bridge_node import BridgeNode

            nodes.append(BridgeNode(config, policy=policy_node.policy))
        if "tts" in names:
            from omni_ros.nodes.tts_node import TtsNode

            nodes.append(TtsNode(config.tts))

        monitor = rclpy.create_node("omni_ros_monitor")
        nodes.append(monitor)
        seen = {"status": 0}

        def on_status(msg: PolicyStatus) -> None:
            seen["status"] += 1
            rate = f"{msg.achieved_rate:.1f}/{msg.control_rate:.0f} Hz"
            dry = ", DRY RUN" if msg.dry_run else ""
            print(
                f"[status] {msg.state_name:<11} {msg.backend} {msg.model}: chunks {msg.chunks}, "
                f"commands {msg.commands} ({rate}), last inference {msg.last_inference_time * 1e3:.0f} ms{dry}"
                f" - {msg.detail}",
                flush=True,
            )

        def on_episode(msg: String) -> None:
            ep = json.loads(msg.data)
            outcome = f"SUCCESS at {ep['time_to_success']:.1f} s" if ep.get("success") else "running"
            print(f"[episode] seed {ep.get('seed')}: '{ep.get('prompt')}' -> {outcome}", flush=True)

        monitor.create_subscription(PolicyStatus, config.status.topic, on_status, 10)
        if "sim" in names:
            monitor.create_subscription(String, config.sim.episode_topic, on_episode, LATCHED)

        # One thread for callbacks is enough (they are short: inference and the control loop have their own
        # threads) and avoids the MultiThreadedExecutor's busy polling, which starves those threads of the GIL.
        executor = make_executor()
        for node in nodes:
            executor.add_node(node)
        stop = {"flag": False}
        signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
        signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
        print(f"omni-ros up: nodes {', '.join(names)} (config '{config.name}'); Ctrl-C to stop", flush=True)
        deadline = time.monotonic() + duration if duration > 0 else float("inf")
        try:
            while not stop["flag"] and time.monotonic() < deadline:
                executor.spin_once(timeout_sec=0.1)
        except ExternalShutdownException:
            pass
        finally:
            shutdown_executor(executor)
        print(f"omni-ros up: stopped ({seen['status']} status reports)", flush=True)
        return 0 if seen["status"] else 1
    finally:
        for node in reversed(nodes):
            node.destroy_node()
        rclpy.try_shutdown()


def _run_processes(
    names: list[str], sim: bool, duration: float, config_path: str | None, policy_args: list[str]
) -> int:
    """One OS process per node (`omni-ros node NAME`), stopped together."""
    base = [sys.executable, "-m", "omni_ros.cli", "node"]
    extra = (["--config", config_path] if config_path else []) + (["--sim"] if sim else [])
    loads_policy = ("policy", "bridge")
    procs = [subprocess.Popen([*base, name, *extra, *(policy_args if name in loads_policy else [])]) for name in names]
    print(
        f"omni-ros up: started {', '.join(f'{n} (pid {p.pid})' for n, p in zip(names, procs, strict=True))}", flush=True
    )
    deadline = time.monotonic() + duration if duration > 0 else float("inf")
    code = 0
    try:
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                code = 1
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    return code
