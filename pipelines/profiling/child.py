"""Entry point of a child: `python -P -m pipelines.profiling.child --role R --config JSON`.

Roles: `compile` (import + compile, see compile_child.run_compile), `check` (correctness on the
task's correctness cases), `measure` (check + time on the device), all three started through
the sandbox (jail.py) because they import kernels; and `verify` (verifier.Verifier: judges the
outputs the others ship), which never imports a kernel.

The child says {"type": "ready", "info": ...} once its stack is imported (info carries the
sandbox layers it got), then answers each {"type": "job", "job": {...}} with zero or more
{"type": "progress"} or {"type": "verify"} messages (the parent answers a verify with a
{"type": "verdict"}) and one {"type": "result", ...}. After a result with restart=True (a
poisoned CUDA context, a tampered process) it exits. The verifier answers each
{"type": "verify"} with a {"type": "verdict"}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from multiprocessing.connection import Connection


def _die_with_parent(parent_pid: int | None) -> None:
    """Ask Linux to SIGKILL us when the parent dies, so a hung kernel never outlives its run."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the parent closing our stdin still ends the idle loop
    if parent_pid and os.getpid() != 1 and os.getppid() != parent_pid:
        os._exit(0)  # the parent died before prctl took effect (in a PID namespace our parent is the jail)


MEASURE_CORES = 2  # cores reserved for the measuring children on a GPU host


def _isolate(role: str) -> None:
    """GPU hosts: measuring children get the first cores to themselves, the others the rest
    at lower priority, so a burst of compiles never slows the launches being timed."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2 * MEASURE_CORES:
        mine = cpus[:MEASURE_CORES] if role == "measure" else cpus[MEASURE_CORES:]
        os.sched_setaffinity(0, mine)
    if role != "measure":
        os.nice(10)


def _start_thread_pools(device: str) -> None:
    """Start now the threads torch and CUDA start on first use (the CPU thread pool, the CUDA
    context's): the parent takes a thread the child did not have when a job was sent for one the
    kernel left running, and replaces the child."""
    import torch

    torch.ones(1 << 20).add_(1.0)  # large enough for a parallel loop
    if device == "cuda":
        torch.zeros(1, device="cuda").add_(1.0)
        torch.cuda.synchronize()


def _serve_verifier(config: dict, send, rx: Connection) -> int:
    """The verifier's loop: one verdict per request, until the parent goes away."""
    from pipelines.profiling.processes import hide_from_children
    from pipelines.profiling.verifier import Verifier

    hide_from_children()
    try:
        verifier = Verifier(config)
        # The CUDA context and torch's first kernel now, while the first kernels compile, not during
        # the first verdicts (the first kernel's checks took 3.4 s on the H200, the next ones' 0.03 s).
        _start_thread_pools(config.get("device", "cpu"))
    except Exception as e:  # noqa: BLE001
        send({"type": "fatal", "error": f"verify worker failed to start: {type(e).__name__}: {e}"})
        return 1
    send({"type": "ready", "info": {"pid": os.getpid()}})
    while True:
        try:
            msg = json.loads(rx.recv_bytes())
        except EOFError:
            return 0
        if msg.get("type") == "exit":
            return 0
        if msg.get("type") == "forget":
            verifier.forget(msg.get("job"))
            continue
        try:
            reply = verifier.handle(msg)
        except Exception as e:  # noqa: BLE001 - our failure, not the kernel's
            logging.exception("verify %s", msg.get("job"))
            reply = {"type": "verdict", "job": msg.get("job"), "seq": msg.get("seq"), "ok": False,
                     "infrastructure": True, "message": f"verifier error: {type(e).__name__}: {e}"[:300]}
        send(reply)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=("compile", "check", "measure", "verify"), required=True)
    ap.add_argument("--config", default="{}")
    args = ap.parse_args(argv)
    config = json.loads(args.config)
    _die_with_parent(config.get("parent_pid"))

    # Keep the protocol on a private fd; anything written to fd 1 from now on lands in stderr.
    tx = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    rx = Connection(os.dup(0), writable=False)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"[{args.role} %(process)d] %(message)s")

    def send(msg: dict) -> None:
        tx.send_bytes(json.dumps(msg).encode())

    def recv() -> dict:
        return json.loads(rx.recv_bytes())

    device = config.get("device", "cpu")
    if args.role == "verify":
        return _serve_verifier(config, send, rx)
    if device == "cuda":
        _isolate(args.role)
    try:
        if os.environ.get("TRITON_INTERPRET") == "1":
            from pipelines.tasks.interpreter_fixes import patch_triton_interpreter

            patch_triton_interpreter()  # bf16 tl.dot is wrong in Triton 3.6's interpreter
        from pipelines.profiling import compile_child, inputs, kernel_loading, runner

        compile_child.COMPILE_INPUTS = config.get("compile_inputs", "device")
        if args.role != "measure":
            # Compile children only need each shape once; keep their cached inputs small, since
            # a dozen of them share the GPU's memory with the measuring child (compile_child.run_compile
            # also returns their allocator's free blocks after each kernel).
            inputs.CACHE.max_bytes = 2 * 2**30
        if args.role == "measure":
            measurer = runner.Measurer(config)
            info = {"hardware": measurer.hardware, "pid": os.getpid()}
        else:
            import torch
            import triton  # noqa: F401

            if device == "cuda":
                torch.cuda.init()
            info = {"pid": os.getpid()}
        from pipelines.profiling import verify
        from pipelines.profiling.jail import LAYERS_ENV

        verify.JUDGE.impl = verify.ChannelJudge(send, recv)
        _start_thread_pools(device)
        if args.role == "measure":
            measurer.warm()  # torch's lazy first-use set-up happens before the baseline, not after it
        if device == "cuda":
            kernel_loading.AUTOTUNE.install()  # before the baseline: the patched autotuner is the harness's
        kernel_loading.start_watch()  # the baseline of identities, once, before any kernel exists here
        info["sandbox"] = os.environ.get(LAYERS_ENV, "")
    except Exception as e:  # noqa: BLE001
        send({"type": "fatal", "error": f"{args.role} worker failed to start: {type(e).__name__}: {e}"})
        return 1
    send({"type": "ready", "info": info})

    while True:
        try:
            msg = json.loads(rx.recv_bytes())
        except EOFError:
            return 0  # the parent went away
        if msg.get("type") == "exit":
            return 0
        job = msg["job"]
        threads_before = len(sys._current_frames())
        try:
            if args.role == "compile":
                result = compile_child.run_compile(job, device, lambda phase: send({"type": "progress", "phase": phase}))
            elif args.role == "check":
                result = runner.run_check(job, device)
            else:
                result = measurer.measure(job, lambda phase: send({"type": "progress", "phase": phase}))
        except Exception as e:
            logging.exception("job %s", job.get("kernel_id"))
            result = {"ok": False, "status": "failed", "failure_kind": "infrastructure",
                      "error": f"harness error: {type(e).__name__}: {e}"[:300], "restart": True}
        # Python threads the job left (the parent also counts every thread in /proc: sandbox.leftovers)
        result["python_threads_left"] = len(sys._current_frames()) - threads_before
        send({"type": "result", "job_id": job.get("job_id"), **result})
        if result.get("restart"):
            sys.stderr.flush()
            os._exit(0)  # skip CUDA teardown in a poisoned context


if __name__ == "__main__":
    sys.exit(main())
