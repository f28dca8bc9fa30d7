"""Runs Lambda execution environments as host processes.

Each execution environment LocalStack starts is one aws-lambda-rie process
(AWS's Lambda Runtime Interface Emulator) serving the function's
``bootstrap`` from the unzipped code, on a loopback port of its own:

    aws-lambda-rie --runtime-interface-emulator-address 127.0.0.1:P
                   --runtime-api-address 127.0.0.1:Q  CODE/bootstrap

RIE runs in a session (process group) of its own and starts the bootstrap in
another process group. ``stop`` kills both groups. Every RIE is started with
the parent-death signal SIGKILL from one long-lived thread, so it dies with
LocalStack however LocalStack ends; a bootstrap whose RIE is gone fails its
next Runtime API call and exits.

Only functions whose code is a ``bootstrap`` executable (the provided.*
runtimes) can run, and only when it is built for this machine.

Settings, read from LocalStack's environment:

  LAMBDA_HOST_RIE  path of aws-lambda-rie (default: aws-lambda-rie on PATH)
  LAMBDA_HOST_ENV  NAME=VALUE pairs, separated by spaces, added to every
                   function's environment unless the function sets NAME
"""

import atexit
import ctypes
import json
import logging
import os
import platform
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

import requests

from localstack import config
from localstack.services.lambda_.invocation.lambda_models import FunctionVersion, InvocationResult
from localstack.services.lambda_.invocation.runtime_executor import (
    LambdaRuntimeException,
    RuntimeExecutor,
)
from localstack.utils.net import get_free_tcp_port

LOG = logging.getLogger(__name__)

INVOKE_PATH = "/2015-03-31/functions/function/invocations"
# RIE's own log lines (logrus), e.g. "26 Nov 2026 07:35:00,123 [INFO] (rapid) ...":
# kept in get_logs, left out of the function's log stream.
RIE_LOG_LINE = re.compile(r"^\d{2} \w{3} \d{4} [\d:,]+ \[\w+\] \(rapid\)")
# How long the REPORT line may follow the response.
REPORT_WAIT_SECONDS = 2.0
# Lines kept for get_logs (startup failures and debugging).
KEPT_LINES = 2000

ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}
HOST_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}.get(
    platform.machine().lower(), platform.machine().lower()
)


def rie_path() -> str | None:
    """The aws-lambda-rie to run: LAMBDA_HOST_RIE, else the one on PATH."""
    path = os.environ.get("LAMBDA_HOST_RIE") or shutil.which("aws-lambda-rie")
    if path and os.access(path, os.X_OK):
        return path
    return None


def host_env() -> dict[str, str]:
    """LAMBDA_HOST_ENV as a dict."""
    env = {}
    for pair in os.environ.get("LAMBDA_HOST_ENV", "").split():
        name, sep, value = pair.partition("=")
        if sep and name:
            env[name] = value
    return env


def elf_machine(path: Path) -> str | None:
    """The machine an ELF executable is built for, None when it is not ELF."""
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    little = header[5] == 1
    machine = int.from_bytes(header[18:20], "little" if little else "big")
    return ELF_MACHINES.get(machine, f"ELF machine {machine:#x}")


class _Spawner:
    """Starts processes from one thread that lives as long as LocalStack.

    The parent-death signal is tied to the thread that forked: spawned from
    LocalStack's short-lived worker threads, a child would be killed when
    that thread ends. Safe for concurrent use.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lambda-host-spawner", daemon=True)
                self._thread.start()
        done: queue.Queue = queue.Queue(maxsize=1)
        self._requests.put((args, kwargs, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def _loop(self) -> None:
        while True:
            args, kwargs, done = self._requests.get()
            try:
                done.put((True, subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs)))
            except Exception as e:  # handed to the caller
                done.put((False, e))


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: own session, SIGKILL when the parent dies."""
    os.setsid()
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_spawner = _Spawner()
_live: set["HostRuntimeExecutor"] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        executors = list(_live)
    for e in executors:
        e.stop()


class HostRuntimeExecutor(RuntimeExecutor):
    """One execution environment: an aws-lambda-rie process and its bootstrap.

    LocalStack calls start once, then invoke one invocation at a time, then
    stop; stop may come from another thread at any time (timeouts).
    """

    def __init__(self, id: str, function_version: FunctionVersion) -> None:
        super().__init__(id=id, function_version=function_version)
        self._proc: subprocess.Popen | None = None
        self._port: int | None = None
        self._lines: list[str] = []  # output since the invocation began
        self._kept: deque[str] = deque(maxlen=KEPT_LINES)
        self._cond = threading.Condition()

    # ----------------------------------------------------------- versions

    @classmethod
    def prepare_version(cls, function_version: FunctionVersion) -> None:
        code = function_version.config.code
        if not code:
            raise LambdaRuntimeException(
                "the host runtime executor runs zip functions only, not container images"
            )
        code.prepare_for_execution()
        bootstrap = Path(code.get_unzipped_code_location()) / "bootstrap"
        if not bootstrap.is_file():
            raise LambdaRuntimeException(
                f"function {function_version.id.function_name}: the host runtime executor runs "
                f"provided.* functions whose code holds an executable named bootstrap; "
                f"runtime {function_version.config.runtime} has none"
            )
        machine = elf_machine(bootstrap)
        if machine is not None and machine != HOST_MACHINE:
            raise LambdaRuntimeException(
                f"function {function_version.id.function_name}: bootstrap is built for {machine}, "
                f"this machine is {HOST_MACHINE}; build it for this machine (GOARCH={_goarch()})"
            )

    @classmethod
    def cleanup_version(cls, function_version: FunctionVersion) -> None:
        pass  # LocalStack removes the unzipped code itself.

    @classmethod
    def validate_environment(cls) -> bool:
        if rie_path() is None:
            LOG.warning(
                "aws-lambda-rie not found (LAMBDA_HOST_RIE or PATH): Lambda functions cannot run"
            )
            return False
        return True

    # ------------------------------------------------------- environment

    def start(self, env_vars: dict[str, str]) -> None:
        rie = rie_path()
        if rie is None:
            raise LambdaRuntimeException("aws-lambda-rie not found: set LAMBDA_HOST_RIE")
        code_dir = Path(self.function_version.config.code.get_unzipped_code_location())
        self._port = get_free_tcp_port()
        api_port = get_free_tcp_port(blocklist=[self._port])
        env = self._environment(env_vars, code_dir)
        args = [
            rie,
            "--log-level", "warn",
            "--runtime-interface-emulator-address", f"127.0.0.1:{self._port}",
            "--runtime-api-address", f"127.0.0.1:{api_port}",
            str(code_dir / "bootstrap"),
        ]
        self._proc = _spawner.popen(
            args,
            cwd=code_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        with _live_lock:
            _live.add(self)
        threading.Thread(target=self._read_output, name=f"lambda-host-{self.id}", daemon=True).start()
        LOG.debug("execution environment %s: aws-lambda-rie pid %s on 127.0.0.1:%s", self.id, self._proc.pid, self._port)
        # RIE starts the bootstrap at the first invocation and gives no ready
        # signal: it is ready when it accepts connections.
        deadline = time.monotonic() + config.LAMBDA_RUNTIME_ENVIRONMENT_TIMEOUT
        while not _accepts(self._port):
            if self._proc.poll() is not None:
                raise LambdaRuntimeException(
                    f"aws-lambda-rie exited with status {self._proc.returncode}: {self.get_logs()}"
                )
            if time.monotonic() > deadline:
                raise LambdaRuntimeException(f"aws-lambda-rie not listening on 127.0.0.1:{self._port}")
            time.sleep(0.02)

    def _environment(self, env_vars: dict[str, str], code_dir: Path) -> dict[str, str]:
        """The environment of RIE, which hands all of it to the bootstrap."""
        env = {k: str(v) for k, v in env_vars.items() if v is not None}
        # Set, it switches RIE into its managed-instances mode.
        env.pop("AWS_LAMBDA_MAX_CONCURRENCY", None)
        own = self.function_version.config.environment or {}
        for name, value in host_env().items():
            if name not in own:
                env[name] = value
        env["LAMBDA_TASK_ROOT"] = str(code_dir)
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        return env

    def stop(self) -> None:
        with _live_lock:
            _live.discard(self)
        proc = self._proc
        if proc is None:
            return
        groups = {proc.pid}
        for pid in _descendants(proc.pid):
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            LOG.warning("execution environment %s: aws-lambda-rie pid %s did not exit", self.id, proc.pid)

    def get_address(self) -> str:
        return "127.0.0.1"

    def get_endpoint_from_executor(self) -> str:
        return "127.0.0.1"

    def get_runtime_endpoint(self) -> str:
        # Unused: RIE answers each invocation on its own connection.
        return f"http://127.0.0.1:{config.GATEWAY_LISTEN[0].port}/_localstack_lambda/{self.id}"

    def get_logs(self) -> str:
        with self._cond:
            return "\n".join(self._kept)

    def _read_output(self) -> None:
        proc = self._proc
        for raw in proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with self._cond:
                self._kept.append(line)
                if not RIE_LOG_LINE.match(line):
                    self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    # ---------------------------------------------------------- invoking

    def invoke(self, payload: dict[str, str]) -> InvocationResult:
        request_id = payload["invoke-id"]
        with self._cond:
            self._lines = []
        timeout = float(self.function_version.config.timeout) + 10
        try:
            resp = requests.post(
                f"http://127.0.0.1:{self._port}{INVOKE_PATH}",
                data=(payload.get("payload") or "").encode(),
                headers={"X-Amzn-RequestId": request_id, "X-Amzn-Trace-Id": payload.get("trace-id", "")},
                timeout=timeout,
                proxies={"http": "", "https": ""},
            )
            status, body = resp.status_code, resp.content
        except requests.RequestException as e:
            status, body = 0, str(e).encode()
        logs = self._invocation_logs(request_id)
        result, is_error = _result(status, body, request_id)
        return InvocationResult(request_id=request_id, payload=result, is_error=is_error, logs=logs)

    def _invocation_logs(self, request_id: str) -> str:
        """The output of the invocation, up to its REPORT line."""
        report = f"REPORT RequestId: {request_id}"
        deadline = time.monotonic() + REPORT_WAIT_SECONDS
        with self._cond:
            while not any(line.startswith(report) for line in self._lines):
                left = deadline - time.monotonic()
                if left <= 0 or self._proc.poll() is not None:
                    break
                self._cond.wait(left)
            lines, self._lines = self._lines, []
        return "".join(line + "\n" for line in lines)


def _result(status: int, body: bytes, request_id: str) -> tuple[bytes, bool]:
    """The invocation's payload and whether it is a function error, as Lambda reports them."""
    text = body.decode("utf-8", errors="replace")
    if status == 200 and text.startswith("Task timed out after "):
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return json.dumps({"errorMessage": f"{stamp} {request_id} {text}"}).encode(), True
    if status == 200:
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            return body, False
        # The runtime's /error call: RIE answers 200 with the error document.
        is_error = isinstance(doc, dict) and "errorType" in doc and set(doc) <= {
            "errorType", "errorMessage", "stackTrace", "trace", "cause"}
        return body, is_error
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and "errorType" in doc:
            return body, True
    except ValueError:
        pass
    message = text.strip() or (f"aws-lambda-rie answered {status}" if status else "no answer from aws-lambda-rie")
    return json.dumps({"errorType": "Runtime.ExitError", "errorMessage": message}).encode(), True


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """The processes below pid, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _goarch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(HOST_MACHINE, HOST_MACHINE)
