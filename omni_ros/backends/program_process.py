"""An exported program run in a process of its own, so that it never holds the caller's GIL.

ExecuTorch's Python binding keeps Python's GIL while a method runs: in the policy node's process a full-size
SmolVLA camera's vision program held it about half a second, and the node's 50 Hz loop fell to 13 commands a
second, against 43 with the program here (bench/results/realtime_program_vnni.json). Here the program's runner
(executorch_runner.ExecuTorchRunner) lives in a child Python process; the caller keeps the processor (tokenizer,
images, normalization) and sends each `sample` the model inputs, noise and real-time-chunking plan, then waits on
a pipe, which releases the GIL.

    runner = ProgramProcess(pte, sidecar, mode="staged", num_threads=2)
    runner.sample(inputs, noise, num_steps, rtc)   # what ExecuTorchRunner.sample returns, computed in the child

Frames on the child's stdin / stdout: an 8-byte length, then a pickle (the child reads only what its parent
writes). The child's own prints and logs go to its stderr, which is the caller's. When the child dies (killed,
out of memory), the request it was serving fails with `ProgramProcessError` naming its exit status, and the next
request starts a new child: the caller keeps serving. When the caller dies, the child reads the end of its stdin
and exits.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import torch

from omni_ros.backends.executorch_runner import ProgramRunner
from omni_ros.errors import OmniRosError
from omni_ros.export.sidecar import Sidecar
from omni_ros.policy.pipeline import Sampled

logger = logging.getLogger("omni_ros.policy")
_LENGTH = struct.Struct("<Q")
# The runner attributes the caller reads (the pipeline, the RTC check at configure, status and metadata).
_ATTRIBUTES = ("backend", "precision", "rtc_methods", "rtc_refusal", "per_token")


class ProgramProcessError(OmniRosError, RuntimeError):
    """The program's process could not start or died while serving a request."""


def _write(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    """The next message, or raises EOFError where the other side has gone."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives a pickle round trip (RtcError, PteError, ValueError...), else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class ProgramProcess(ProgramRunner):
    """An `ExecuTorchRunner` in a child process, behind the same runner interface."""

    def __init__(self, pte: Path, sidecar: Sidecar, mode: str, num_threads: int = 0) -> None:
        super().__init__(pte, sidecar, mode)  # the RTC methods: the child's runner's, once it has loaded the program
        self.num_threads = num_threads
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._start()

    @property
    def pid(self) -> int | None:
        """The child's process id (None between a death and the next request)."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        # The child's torch threads (the Euler loop's small ops between methods) as the caller's.
        command = [sys.executable, "-m", __name__, str(self.pte), self.mode, str(self.num_threads)]
        command.append(str(torch.get_num_threads()))
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            status, payload = _read(proc.stdout)  # type: ignore[arg-type]
        except EOFError:
            code = proc.wait()
            raise ProgramProcessError(
                f"{self.pte}: the program's process exited ({_status(code)}) before loading it; its log is above"
            ) from None
        if status == "error":
            proc.wait()
            raise payload
        for name, value in payload.items():
            setattr(self, name, value)
        self._proc = proc
        logger.info("%s: the program runs in process %d (%s)", self.pte.name, proc.pid, self.backend)

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:  # one request at a time, as the runner in the child serves them
            if self._proc is None or self._proc.poll() is not None:
                logger.warning("%s: starting the program's process again", self.pte.name)
                self._stop()
                self._start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            try:
                _write(proc.stdin, (method, args))
                status, payload = _read(proc.stdout)
            except (EOFError, BrokenPipeError, OSError):
                code = proc.wait()
                self._proc = None
                raise ProgramProcessError(
                    f"{self.pte}: the program's process died during {method} ({_status(code)}); the next request "
                    "starts it again"
                ) from None
        if status == "error":
            raise payload
        return payload

    def sample(self, inputs: Any, noise: torch.Tensor | None, num_steps: int | None, rtc: Any = None) -> Sampled:
        return self._call("sample", inputs, noise, num_steps, rtc)

    def generate(self, inputs: Any) -> Any:
        return self._call("generate", inputs)

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                _write(proc.stdin, ("close", ()))
            proc.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        """Stop the child (the program and its packed weights go with it); safe to call twice."""
        with self._lock:
            self._stop()


def _status(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def main(argv: list[str] | None = None) -> int:
    """The child: load PTE's program (MODE, NUM_THREADS pool threads, TORCH_THREADS) and serve its parent."""
    pte, mode, num_threads, torch_threads = argv if argv is not None else sys.argv[1:]
    # Ctrl-C in a terminal reaches the whole process group: the parent decides when this process ends (it closes
    # the pipe, or dies and the pipe ends with it), so a request under way is answered, not cut off.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Frames go on the original stdout; anything printed afterwards lands on stderr instead of corrupting them.
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stderr)
    try:
        from omni_ros.backends.executorch_runner import ExecuTorchRunner
        from omni_ros.export.sidecar import read_sidecar

        torch.set_num_threads(int(torch_threads))
        runner = ExecuTorchRunner(Path(pte), read_sidecar(Path(pte)), mode, int(num_threads))
    except Exception as exc:
        _write(frames, ("error", _portable(exc)))
        return 1
    _write(frames, ("ready", {name: getattr(runner, name) for name in _ATTRIBUTES if hasattr(runner, name)}))
    while True:
        try:
            method, args = _read(requests)
        except EOFError:  # the parent has gone
            break
        if method == "close":
            break
        try:
            reply = ("ok", getattr(runner, method)(*args))
        except Exception as exc:  # the request fails, the process serves on (as the runner in a caller's process)
            reply = ("error", _portable(exc))
        try:
            _write(frames, reply)
        except BrokenPipeError:  # the parent has gone while this request ran
            break
    runner.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
