"""Shared fixtures: isolated cache and data dirs, so tests never touch the user's."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.proposers.templates.common import Template, TemplateParams
from kernelforge_tui.vocabulary.nodes import ParamValue

if TYPE_CHECKING:
    from tests.support.gpu_harness import Harness

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the whole session shares: under xdist, the one holding every worker's own (pytest-N)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def shared_bytecode(session_dir: Path) -> Iterator[None]:
    """The Python processes tests start (the CLI, workers, tools) compile the package once for the session, not
    each on its own: their bytecode goes to a cache in the session's directory, also where the environment
    (PYTHONDONTWRITEBYTECODE) would have every process compile every module again."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPYCACHEPREFIX", str(session_dir / "pycache"))
        patch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        yield


@pytest.fixture(autouse=True)
def isolated_dirs(
    session_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The cache shared by the session (the product's builders put their cubins in `cubin_cache`), data and config
    per test."""
    monkeypatch.setenv("KERNELFORGE_CACHE_DIR", str(session_dir / "cache"))
    monkeypatch.setenv("KERNELFORGE_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    monkeypatch.setenv("KERNELFORGE_CONFIG", str(tmp_path_factory.mktemp("config") / "config.toml"))
    yield


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for a GPU test module, so its evaluators (and their workers) live across tests."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def harness(loop: asyncio.AbstractEventLoop) -> Iterator[Harness]:
    from tests.support.gpu_harness import Harness

    h = Harness(loop)
    yield h
    h.close()


@pytest.fixture(scope="session")
def cubin_cache(session_dir: Path) -> Path:
    """The session's one cubin cache, for every test file and every xdist worker, where the product's own builders
    (searches, the CLI's processes) keep theirs under `isolated_dirs`: a source built with the same flags anywhere
    in the session is built once (a later build, in any process, finds the entry; entries are written atomically).
    Each test makes its own Builder over it (a Builder holds asyncio primitives). Skipped where nvcc is missing."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    return session_dir / "cache" / "cubin"


@pytest.fixture
def sm90_builder(tmp_path: Path, cubin_cache: Path) -> Builder:
    """An nvcc builder for sm_90 with -O3 (no line info) over the session's cubin cache: the template tests that
    build their variants and read ptxas's report (spills, shared memory)."""
    return Builder(arch="sm_90", flags=("-O3",), cache_dir=cubin_cache, work_dir=tmp_path)


def typed(template: Template[Any], card: OperatorCard, params: Mapping[str, ParamValue] | TemplateParams) -> Any:
    """The params as the template's model for the card, whatever their values (a test may check one the card's space
    lacks, which `Template.valid` would refuse)."""
    return template.params_type(card).model_validate(params if isinstance(params, TemplateParams) else dict(params))


def canonical(template: Template[Any], card: OperatorCard, params: Mapping[str, ParamValue]) -> dict[str, Any] | None:
    """`Template.valid` as the dict a node stores (None: not valid)."""
    found = template.valid(card, params)
    return None if found is None else found.as_dict()
