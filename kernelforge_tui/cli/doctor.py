"""`kernelforge doctor`: what this machine has for each stage (Python, nvcc, the sandbox, GPU, pycuda, ncu, torch),
whether a Dask cluster (`--cluster`, or the configured one) answers with GPU workers, and whether each configured
LLM model answers: a one-token streamed request to its provider, and what is wrong when
it does not (unreachable, no key, bad key, unknown model, no streaming, timeout), and which models have no price
(a money budget refuses them). The key itself is never shown.

Its exit code says whether the main job, building, proving and timing kernels, can run here: 1 when nothing can be
built (Python, the config, nvcc) or a configured model does not answer, 3 when kernels build but cannot run (no GPU,
no pycuda), 0 otherwise; what only narrows the work (no ncu: no profiles; no torch: no captures) is a line with its fix.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import sys

import httpx
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.build.cutlass_headers import PINNED, cutlass_problem, find_cutlass
from kernelforge_tui.build.nvcc import find_nvcc, nvcc_version
from kernelforge_tui.build.sandbox import sandbox_status
from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK
from kernelforge_tui.config import (
    ConfigError,
    LlmSettings,
    ModelSettings,
    Retries,
    Settings,
    Timeouts,
    config_file,
    load_settings,
    pricing_line,
)
from kernelforge_tui.engine.cluster.backend import Cluster, worker_command
from kernelforge_tui.errors import KernelForgeError, NoGpu, install_fix
from kernelforge_tui.gpu.detect import detect_gpus, pycuda_problem
from kernelforge_tui.llm import ChatMessage, ChatRequest, LlmError, Provider
from kernelforge_tui.llm.wire import WireError

PROBE_CONNECT_S = 5.0
PROBE_IDLE_S = 20.0
PROBE_TOTAL_S = 30.0
"""A probe waits at most this long (or the provider's own timeouts, when shorter), and is not retried."""


class Check(BaseModel):
    """One line of `kernelforge doctor`."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    problem: str = ""
    """What is wrong, for scripts (LLM checks): unreachable, no_key, bad_key, unknown_model, no_streaming, timeout,
    rate_limited, server, bad_request, protocol, dropped; unpriced (the pricing check)."""


def doctor_checks(cluster: str | None = None) -> list[Check]:
    """What this machine has for each stage, and the fix for what it lacks; with a cluster (`cluster`, else the
    configured `[cluster] address`), whether its scheduler answers and what its workers offer."""
    checks: list[Check] = []

    def add(name: str, ok: bool, detail: str, fix: str = "") -> None:
        checks.append(Check(name=name, ok=ok, detail=detail, fix="" if ok else fix))

    add("python", sys.version_info >= (3, 11), platform.python_version(), "use Python 3.11 or newer")
    settings: Settings | None = None
    try:
        settings = load_settings()
        add("config", True, str(config_file()) if config_file().is_file() else "no config file: defaults")
    except ConfigError as exc:
        add("config", False, exc.what(), exc.fix)
    nvcc = find_nvcc(settings.build.nvcc if settings else None)
    if nvcc is None:
        add("nvcc", False, "not found", "install the CUDA toolkit, or set KERNELFORGE_BUILD__NVCC to nvcc's path")
    else:
        try:
            add("nvcc", True, f"{nvcc_version(nvcc)} ({nvcc})")
        except (OSError, ValueError) as exc:
            add("nvcc", False, str(exc), "repair the CUDA toolkit installation")
    sandbox = sandbox_status()
    add(
        "compiler sandbox",
        sandbox.mode != "limits",
        sandbox.description,
        "install bubblewrap (apt install bubblewrap) or allow unprivileged user namespaces, so nvcc cannot read "
        "host files",
    )
    checks.append(cutlass_check())
    gpus = detect_gpus()
    for gpu in gpus:
        add(f"gpu {gpu.index}", True, f"{gpu.name}, compute capability {gpu.capability}, {gpu.memory_mib} MiB")
    if gpus:
        add("driver", True, gpus[0].driver)
    else:
        add(
            "gpu",
            False,
            "no NVIDIA GPU found (nvidia-smi is missing or lists none)",
            "evaluate on a machine with an NVIDIA GPU and its driver; cards and builds work without one",
        )
    problem = pycuda_problem()
    add(
        "pycuda",
        problem is None,
        _version("pycuda") if problem is None else "not installed",
        install_fix("gpu") + " (builds against the CUDA toolkit)",
    )
    ncu = shutil.which("ncu")
    add("ncu", ncu is not None, ncu or "not found", "install Nsight Compute (in the CUDA toolkit) for profiling")
    torch = importlib.util.find_spec("torch") is not None
    add(
        "torch",
        torch,
        _version("torch") if torch else "not installed",
        install_fix("torch") + " to capture PyTorch models",
    )
    if settings is not None:
        address = cluster or settings.cluster.address
        if address:
            checks.append(asyncio.run(cluster_check(address, settings)))
        checks += llm_checks(settings.llm)
    return checks


def cutlass_check() -> Check:
    """Whether candidates may include CUTLASS/CuTe here: the headers' version and root, or why not."""
    headers = find_cutlass()
    if headers is None:
        return Check(name="cutlass", ok=False, detail="not installed", fix=cutlass_problem() or "")
    pinned = "" if headers.pinned else f"; not the pinned {PINNED}, which the GEMM template was measured with"
    detail = f"CUTLASS {headers.version} ({headers.distribution or 'a tree given by path'}) at {headers.root}{pinned}"
    return Check(name="cutlass", ok=True, detail=detail)


CLUSTER_PROBE_S = 10.0
"""How long the doctor waits for the scheduler (and one worker's nvcc)."""


async def cluster_check(address: str, settings: Settings) -> Check:
    """The scheduler answers; its workers, their GPUs and their nvcc (asked of one): what a search there needs."""
    probe = settings.cluster.model_copy(update={"wait_s": min(settings.cluster.wait_s, CLUSTER_PROBE_S)})
    cluster = Cluster(address, settings.model_copy(update={"cluster": probe}))
    fix = f"start one worker per GPU: {worker_command(address)} (README: On a Dask cluster)"
    try:
        await cluster.client()
        workers, gpus = len(cluster.workers()), cluster.gpus()
        if gpus == 0:
            return Check(name="cluster", ok=False, detail=f"{address}: {workers} workers, none offers a GPU", fix=fix)
        async with asyncio.timeout(CLUSTER_PROBE_S):
            version = await cluster.nvcc_version()
    except (KernelForgeError, TimeoutError) as exc:
        return Check(name="cluster", ok=False, detail=f"{address}: {exc}", fix=fix)
    finally:
        await cluster.close()
    return Check(name="cluster", ok=True, detail=f"{address}: {workers} workers, {gpus} GPUs, nvcc {version}")


ESSENTIAL = frozenset({"python", "config", "nvcc"})
"""Without these nothing can be built: cards, builds and the simulated search stop too."""
TO_RUN = frozenset({"gpu", "pycuda"})
"""Without these kernels build but cannot be proven or timed: the main job cannot run here."""
NARROWED = {
    "ncu": "without ncu the search runs unprofiled",
    "cutlass": "without CUTLASS the matrix-product cards have no template",
    "pricing": "unpriced models: no --budget-money",
}
"""What a missing part only narrows, as the verdict says it."""


def verdict(checks: list[Check]) -> tuple[int, str]:
    """The exit code and the one line under the table: can the main job run on this machine?"""
    missing = {c.name for c in checks if not c.ok}
    if missing & ESSENTIAL:
        return EXIT_FAILED, f"nothing can be built here: fix {', '.join(sorted(missing & ESSENTIAL))} first"
    if any(name.startswith("llm ") for name in missing):
        return EXIT_FAILED, "a configured LLM model does not answer: fix it, or search with --proposer templates"
    if "cluster" in missing:
        return NoGpu.exit_code, "the configured Dask cluster cannot evaluate: fix it, or search on this machine"
    if any(c.name == "cluster" for c in checks):
        return EXIT_OK, "ready: kernels are built and evaluated on the Dask cluster"
    if missing & TO_RUN:
        return NoGpu.exit_code, (
            f"kernels build here but cannot run (missing: {', '.join(sorted(missing & TO_RUN))}): eval and optimize "
            "need a GPU and pycuda; cards, builds, `optimize --simulate` and `open` on recorded runs work"
        )
    narrowed = [why for name, why in NARROWED.items() if name in missing]
    return EXIT_OK, "ready: kernels can be built, proven correct and timed here" + (
        f" ({'; '.join(narrowed)})" if narrowed else ""
    )


def llm_checks(llm: LlmSettings) -> list[Check]:
    """One check per configured model (a one-token streamed request each, all at once), or one line saying that the
    template proposer is used."""
    if not llm.configured:
        return [
            Check(
                name="llm",
                ok=True,
                detail="no LLM configured: the template proposer is used (configure [[llm.providers]] and "
                "[[llm.models]] for --proposer agents or hybrid)",
            )
        ]
    return [*asyncio.run(_probe_all(llm)), pricing_check(llm)]


def pricing_check(llm: LlmSettings) -> Check:
    """Which models have no price: without one a call costs nothing against --budget-money, which then refuses to
    start. Searching without a money budget still works, so this only narrows the work."""
    unpriced = llm.unpriced(llm.models)
    if not unpriced:
        return Check(name="pricing", ok=True, detail=f"every model has a price ({len(llm.models)})")
    return Check(
        name="pricing",
        ok=False,
        detail="no price for " + ", ".join(f"{m.name} ({m.model})" for m in unpriced) + ": --budget-money refuses",
        fix="add under [llm.pricing]: "
        + "; ".join(pricing_line(m.model) for m in unpriced)
        + " (the provider's US dollars per million tokens; 0 for a local server)",
        problem="unpriced",
    )


async def _probe_all(llm: LlmSettings) -> list[Check]:
    async with httpx.AsyncClient() as http:
        return list(await asyncio.gather(*(probe_model(llm, model, http) for model in llm.models)))


def probe_request(model: ModelSettings) -> ChatRequest:
    """One token, streamed, without the model's extra fields (a thinking budget needs more than one token); a model
    configured with max_completion_tokens (OpenAI's reasoning models take no max_tokens) gets 1 of those."""
    extra = {"max_completion_tokens": 1} if "max_completion_tokens" in model.extra else {}
    return ChatRequest(
        model=model.model, messages=(ChatMessage(role="user", content="Say OK."),), max_tokens=1, extra=extra
    )


async def probe_model(llm: LlmSettings, model: ModelSettings, http: httpx.AsyncClient) -> Check:
    """Send the model's provider a one-token streamed request and say what is wrong, if anything."""
    configured = llm.provider(model.provider)
    timeouts = configured.timeouts
    settings = configured.model_copy(
        update={
            "retries": Retries(max_attempts=1),
            "timeouts": Timeouts(
                connect_s=min(timeouts.connect_s, PROBE_CONNECT_S),
                idle_s=min(timeouts.idle_s, PROBE_IDLE_S),
                total_s=min(timeouts.total_s, PROBE_TOTAL_S),
            ),
        }
    )
    where = f"{configured.name} ({configured.protocol}, {configured.base_url}), model {model.model}"
    name = f"llm {model.name}"
    try:
        reply = await Provider(settings, http).chat(probe_request(model))
    except httpx.InvalidURL as exc:
        fix = "correct base_url, e.g. https://api.openai.com/v1 or http://localhost:8000/v1"
        return Check(name=name, ok=False, detail=f"{where}: not a URL ({exc})", fix=fix, problem="unreachable")
    except LlmError as err:
        problem, detail = _diagnosis(err, model)
        return Check(name=name, ok=False, detail=f"{where}: {detail}", fix=err.fix, problem=problem)
    tokens = f", {reply.usage.input_tokens} tokens in" if reply.usage is not None else ", no usage reported"
    return Check(name=name, ok=True, detail=f"{where}: streamed a reply in {reply.latency_s:.2f} s{tokens}")


def _causes(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__
    return chain


def _diagnosis(err: LlmError, model: ModelSettings) -> tuple[str, str]:
    """(problem, what was seen) of a failed probe, by the error's kind and cause (never its text)."""
    causes = _causes(err)
    if err.kind == "no_key":
        return "no_key", f"no key: {err.problem}"
    if err.kind == "auth":
        return "bad_key", f"bad key: {err.problem}"
    if err.kind == "not_found":
        return "unknown_model", f"unknown model {model.model!r} (or a wrong base_url): {err.problem}"
    if err.kind in ("idle", "timeout"):
        return "timeout", f"timeout: {err.problem}"
    unreachable = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)
    if err.kind == "dropped" and any(isinstance(c, unreachable) for c in causes):
        return "unreachable", f"unreachable: {err.problem}"
    if err.kind == "protocol" and not any(isinstance(c, WireError) for c in causes):
        return "no_streaming", f"no streaming: {err.problem}"
    return err.kind, err.problem


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    checks = doctor_checks(args.cluster)
    if args.json:
        print(json.dumps([c.model_dump() for c in checks], indent=2))
    else:
        table = Table(title="kernelforge doctor", show_lines=False)
        for column in ("part", "", "found"):
            table.add_column(column)
        for c in checks:
            status = "[green]ok[/]" if c.ok else f"[red]{escape(c.problem.replace('_', ' ') or 'missing')}[/]"
            table.add_row(c.name, status, escape(c.detail))
        console.print(table)
        for c in checks:  # under the table, whole: a command in a fix is copied as it is, never cut by a column
            if c.fix:
                console.print(f"[bold]fix {escape(c.name)}:[/] {escape(c.fix)}", soft_wrap=True)
    code, line = verdict(checks)
    if not args.json:
        console.print(f"[{'green' if code == EXIT_OK else 'red'} bold]{escape(line)}[/]")
    return code
