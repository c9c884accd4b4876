"""Engine processes as instances: the engine off the server's interpreter lock.

Design note (DESIGN.md §4, the `HostedInstance` interface): an in-process instance
(andante.runtime.local) steps its engine in a thread of the HTTP server's process, so
the engine's Python between torch calls (scheduling, sampling, output processing) takes
turns for one interpreter lock with the event loop's SSE writes, JSON encoding and the
controller; vLLM v1 runs its engine core in a separate process for the same reason. A
`ProcessInstance` runs the same `InstanceWorker` in a child process (multiprocessing,
"spawn": the child imports a clean interpreter; no torch state is forked) and talks to
it in the Ray backend's message shapes (andante.runtime.ray_actors): requests, aborts
and withdrawals go down one pipe, in order, applied by the child at its next step
boundary; each engine step comes back up the other pipe as one `StepMessage` carrying
all of that step's tokens, which a pump thread of the server hands to `post`. The child
writes its messages from a thread of its own (`MessageSender`), so its engine thread
goes straight on to the next step (`ANDANTE_NO_ENGINE_SENDER=1`: the engine thread
writes them, as before). Once its engine is built the child freezes its heap
(andante.runtime.gc_heap; `ANDANTE_NO_GC_FREEZE=1` does not).

The child builds its worker with a picklable `factory(index)` (the Ray backend's) on a
`WallClock` sharing the server's origin, so arrival and token times are on one line.
When the child dies (killed, out of memory, its engine raised) the pump reports the
instance down with the reason: the controller re-queues its requests that have not
streamed a token and fails the others with an error; none is lost silently. An engine
process does not come back by itself (`restartable` is False), like a thread.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import pickle
import queue
import signal
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from andante.cluster.instance import BASIC_CAPABILITIES, LaterOperations
from andante.cluster.load import LoadReport
from andante.core.request import Request
from andante.engine.stats import EngineLimits
from andante.perf.paths import env_switch
from andante.runtime.gc_heap import freeze_heap
from andante.runtime.ray_actors import WorkerFactory
from andante.runtime.worker import InstanceWorker, OnChange, Post, StepMessage

log = logging.getLogger("andante.cluster")

NO_SENDER_ENV = "ANDANTE_NO_ENGINE_SENDER"  # 1: the engine thread writes its messages
IDLE_WAIT_S = 0.5
START_POLL_S = 0.5
_STOP = ("stop", None)


class EngineProcessError(RuntimeError):
    """The engine process failed to start, or died while serving."""


class ProcessInstance(LaterOperations):
    """An `Instance` whose engine steps in a child process (see the module note)."""

    capabilities = BASIC_CAPABILITIES

    def __init__(self, index: int, factory: WorkerFactory, role: str = "",
                 log_level: int = logging.WARNING) -> None:
        self.index = index
        self.role = role
        self._init_process(factory, log_level)
        self._init_threads()

    def _init_process(self, factory: WorkerFactory, log_level: int) -> None:
        context = multiprocessing.get_context("spawn")
        commands_out, commands_in = context.Pipe(duplex=False)
        messages_out, messages_in = context.Pipe(duplex=False)
        self.process = context.Process(
            target=child_main, args=(factory, self.index, commands_out, messages_in, log_level),
            name=f"andante-engine-{self.index}", daemon=True)
        self.process.start()
        commands_out.close()  # the child's ends: only the child holds them now
        messages_in.close()
        self._commands = commands_in
        self._messages = messages_out

    def _init_threads(self) -> None:
        self._report = LoadReport()
        self._described: tuple[EngineLimits, str] | None = None
        self._outbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name=f"andante-engine-{self.index}-send")
        self._sender.start()
        self._pump: threading.Thread | None = None
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    # ---- the Instance seam (controller thread) ------------------------------------
    @property
    def alive(self) -> bool:
        return self.error is None and self.process.is_alive()

    @property
    def restartable(self) -> bool:
        return False

    def submit(self, req: Request) -> None:
        self._outbox.put(("add", req))

    def abort(self, request_id: str) -> None:
        self._outbox.put(("abort", request_id))

    def withdraw(self, request_ids: Sequence[str]) -> None:
        self._outbox.put(("withdraw", list(request_ids)))

    def load(self) -> LoadReport:
        return self._report

    def observe(self, message: StepMessage) -> None:
        self._report = message.load

    def describe(self, timeout: float | None = None) -> tuple[EngineLimits, str]:
        """The child's engine limits and model name: waits until its engine is built
        (EngineProcessError if it fails or does not answer within `timeout` s)."""
        if self._described is None:
            self._described = self._await_ready(timeout)
        return self._described

    def _await_ready(self, timeout: float | None) -> tuple[EngineLimits, str]:
        waited = 0.0
        while not self._messages.poll(START_POLL_S):
            waited += START_POLL_S
            if not self.process.is_alive():
                raise EngineProcessError(f"instance {self.index}: the engine process exited "
                                         f"with status {self.process.exitcode} while starting")
            if timeout is not None and waited >= timeout:
                raise EngineProcessError(f"instance {self.index}: the engine process did not "
                                         f"start within {timeout:g} s")
        kind, payload = self._receive_startup()
        if kind != "ready":
            if isinstance(payload, (ValueError, OSError)):
                raise payload  # bad options or a missing model: as in this process
            raise EngineProcessError(f"instance {self.index}: the engine process failed to "
                                     f"start: {payload}")
        limits, name, pid = payload
        log.info("instance %d: engine process %d ready", self.index, pid)
        return limits, name

    def _receive_startup(self) -> tuple[str, Any]:
        try:
            item = self._messages.recv()
        except (EOFError, OSError) as exc:
            return "failed", f"its pipe closed ({exc!r})"
        if not isinstance(item, tuple):
            return "failed", f"unexpected first message {type(item).__name__}"
        return item

    # ---- lifecycle ----------------------------------------------------------------
    def start(self, post: Post, on_down: OnChange, on_up: OnChange | None = None) -> None:
        """Pump the child's step messages to `post` (`on_up` is never called)."""
        if self._pump is not None:
            raise RuntimeError(f"instance {self.index} is already started")
        self.describe()
        self._pump = threading.Thread(target=self._pump_loop, args=(post, on_down),
                                      name=f"andante-engine-{self.index}-pump", daemon=True)
        self._pump.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the child to stop, then end it if it does not within `timeout` s."""
        self._stopping.set()
        self._outbox.put(_STOP)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
        for thread in (self._pump, self._sender):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
        self._messages.close()

    def _send_loop(self) -> None:
        """Pickle and write commands off the event loop (a full pipe waits here)."""
        while True:
            command = self._outbox.get()
            with contextlib.suppress(OSError, ValueError):  # a dead child: the pump says
                self._commands.send(command)
            if command is _STOP:
                self._commands.close()
                return

    def _pump_loop(self, post: Post, on_down: OnChange) -> None:
        reason = "its pipe closed"
        while True:
            try:
                item = self._messages.recv()
            except (EOFError, OSError):
                break
            if isinstance(item, StepMessage):
                post(item)
            elif item[0] == "error":
                reason = item[1]
                break
        if self._stopping.is_set():
            return
        self.process.join(1.0)
        self.error = EngineProcessError(
            f"instance {self.index}: the engine process died (exit status "
            f"{self.process.exitcode}): {reason}")
        log.error("%s", self.error)
        on_down(self.index, self.error)


# ---- the child process --------------------------------------------------------------
def child_main(factory: WorkerFactory, index: int, commands: Connection,
               messages: Connection, log_level: int) -> None:
    """The engine process: build the worker, report ready, step until told to stop or
    the server goes away (its pipe closes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    logging.basicConfig(level=log_level,
                        format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    try:
        worker = factory(index)
        limits, name = worker.describe()
    except BaseException as exc:
        log.debug("instance %d could not start", index, exc_info=True)
        messages.send(("failed", portable(exc)))
        return
    freeze_heap()  # the model and start-up objects: never walked again (gc_heap.py)
    messages.send(("ready", (limits, name, multiprocessing.current_process().pid)))
    sender = MessageSender(messages)
    try:
        serve_steps(worker, commands, messages if env_switch(NO_SENDER_ENV) else sender)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return  # the server is gone
    except BaseException as exc:  # the engine is broken: this instance stays down
        log.exception("instance %d failed", index)
        with contextlib.suppress(BrokenPipeError, EOFError, ConnectionResetError, OSError):
            sender.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


class MessageSender:
    """Writes the child's messages to the server from a thread of its own, in order, so
    that the engine's thread goes on to its next step instead of pickling a step's
    message and waiting for the pipe (a write wakes the server's reader, which on a
    machine with as many busy threads as cores can take the writer's core for a while).
    A write that fails (the server is gone) is raised by the next `send`."""

    def __init__(self, messages: Connection) -> None:
        self._messages = messages
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="andante-engine-messages")
        self._thread.start()

    def send(self, message: Any) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(message)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while (message := self._queue.get()) is not _STOP:
            if self._error is not None:
                continue  # the pipe is gone: drop the rest
            try:
                self._messages.send(message)
            except (BrokenPipeError, EOFError, ConnectionResetError, OSError) as exc:
                self._error = exc


def portable(exc: BaseException) -> BaseException:
    """`exc` if it pickles (the server re-raises a ValueError or OSError as it is),
    else a RuntimeError naming it."""
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def serve_steps(worker: InstanceWorker, commands: Connection,
                messages: MessageSender | Connection) -> None:
    """Apply the commands that arrived, run one step, send its message; with nothing
    to do, wait for a command. Returns when told to stop."""
    while apply_commands(worker, commands):
        message = worker.step(0)
        if message is not None:
            messages.send(message)
        elif not worker.engine.has_work:
            commands.poll(IDLE_WAIT_S)


def apply_commands(worker: InstanceWorker, commands: Connection) -> bool:
    """Hand every waiting command to the worker's inbox; False on "stop"."""
    while commands.poll(0):
        kind, item = commands.recv()
        if kind == "add":
            worker.submit(item)
        elif kind == "abort":
            worker.abort(item)
        elif kind == "withdraw":
            worker.withdraw(item)
        elif kind == "stop":
            return False
        else:
            raise ValueError(f"unknown command {kind!r}")
    return True
