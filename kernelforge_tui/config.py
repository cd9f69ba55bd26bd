"""Settings: one pydantic model read from a TOML file and `KERNELFORGE_*` environment variables.

Why one model: every command (CLI, TUI, worker) reads the same paths and limits, so a user sets them
once, in `~/.config/kernelforge-tui/config.toml` or the environment (`KERNELFORGE_GPU__ARCH=sm_90`).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypedDict, TypeVar

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kernelforge_tui.errors import FieldError, not_utf8

APP_NAME = "kernelforge-tui"

MAX_CEILING_MARGIN = 1.5
"""The ceiling check flags a kernel faster than `ceiling_margin` x the measured ceiling. Honest kernels stay under
the ceiling (the recorded bests reach 88-89% of it); a margin much above 1 only lets skipped work through, and a
large one switches the check off."""
MIN_FLUSH_BYTES = 128 * 1024 * 1024
"""The L2 flush before each timed launch writes at least this much: more than twice an H200's L2 (50 MB), so that a
flush evicts it rather than leaving the candidate's data cached."""
MAX_LOG_BYTES = 64 << 10
"""nvcc output kept of one build at most: `build.max_log_bytes`'s default, and what the store keeps of any build."""
MAX_DIAGNOSTICS = 200
"""nvcc messages kept of one build at most: `build.max_diagnostics`'s default, and the store's cap."""
MAX_GLOBAL_BYTES = 64 << 20
"""Device globals (`__device__` arrays) a kernel may declare at most, in bytes: `build.max_global_bytes`'s default
(the launch plan's buffers hold a kernel's data)."""


class ConfigError(FieldError):
    """A config file or KERNELFORGE_* variable that cannot be used (bad input: exit code 2)."""


class Section(BaseModel):
    """A table of the config file: an unknown key is an error, so a misspelt setting is not silently ignored."""

    model_config = ConfigDict(extra="forbid")


def cache_dir() -> Path:
    """Where compiled cubins and measured ceilings live (safe to delete)."""
    return Path(os.environ.get("KERNELFORGE_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME))


def data_dir() -> Path:
    """Where runs (one SQLite store each) live by default."""
    return Path(os.environ.get("KERNELFORGE_DATA_DIR") or platformdirs.user_data_dir(APP_NAME))


def kernels_dir() -> Path:
    """Where kernels taken away from a run go by default (the TUI's export key): under the data dir, never inside
    a checkout or beside a read-only example run."""
    return data_dir() / "kernels"


def config_file() -> Path:
    """The user's TOML settings file (optional); `KERNELFORGE_CONFIG` names another one."""
    explicit = os.environ.get("KERNELFORGE_CONFIG")
    return Path(explicit) if explicit else Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


class BuilderOptions(TypedDict):
    """What a Builder takes from `[build]` beside nvcc, the target and its parallelism: the same wherever one is made
    (here, on the coordinator of a cluster and on its workers), since the cache key includes them."""

    flags: list[str]
    timeout_s: float
    max_log_bytes: int
    max_diagnostics: int
    max_global_bytes: int


class BuildSettings(Section):
    """How candidates are compiled."""

    nvcc: str | None = None
    """Path to nvcc; found on PATH or under $CUDA_HOME/bin when unset."""
    arch: str | None = None
    """Target such as `sm_90`; detected from the GPU (nvidia-smi) when unset, else sm_90."""
    flags: list[str] = Field(default_factory=lambda: ["-O3", "-lineinfo"])
    """Extra nvcc flags for every candidate (the cache key includes them)."""
    timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    """A build that takes longer is stopped and recorded as failed."""
    max_parallel: int = Field(default_factory=lambda: os.cpu_count() or 2, ge=1)
    """How many nvcc processes run at once."""
    max_log_bytes: int = Field(default=MAX_LOG_BYTES, ge=1024)
    """nvcc output kept per build at most; a build whose output goes over it is stopped and refused."""
    max_diagnostics: int = Field(default=MAX_DIAGNOSTICS, ge=1)
    """nvcc messages kept per build at most; a build with more is stopped and refused."""
    max_global_bytes: int = Field(default=MAX_GLOBAL_BYTES, ge=0)
    """Device globals (`__device__` arrays) a kernel may declare, in bytes; a kernel with more is refused."""

    def builder_options(self) -> BuilderOptions:
        return BuilderOptions(
            flags=list(self.flags),
            timeout_s=self.timeout_s,
            max_log_bytes=self.max_log_bytes,
            max_diagnostics=self.max_diagnostics,
            max_global_bytes=self.max_global_bytes,
        )


class EvalSettings(Section):
    """How candidates are proven correct and timed."""

    timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """Watchdog: a request to the GPU worker that takes longer kills the worker (a hung kernel)."""
    fresh_seeds: int = Field(default=2, ge=0)
    """Fresh seeded input sets drawn per card on top of the card's own input sets (at least 1 in a user's
    settings, see `UserEvalSettings`; none for the worker's single profiled launch)."""
    min_reps: int = Field(default=20, ge=1)
    """Timed repetitions at least, per kernel."""
    max_reps: int = Field(default=400, ge=1, validate_default=True)
    """Timed repetitions at most, per kernel (not below min_reps)."""
    target_rel_error: float = Field(default=0.002, gt=0, allow_inf_nan=False)
    """Stop repeating once the standard error of the median is under this share of it."""
    timing_budget_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """GPU seconds that timing one candidate (with its baseline) may take at most."""
    ceiling_margin: float = Field(default=1.10, ge=1.0, le=MAX_CEILING_MARGIN, allow_inf_nan=False)
    """A kernel faster than this multiple of the measured ceiling skipped work: flagged as a cheat."""
    flush_bytes: int = Field(default=256 * 1024 * 1024, ge=MIN_FLUSH_BYTES)
    """Scratch written before each timed launch to evict the L2 (50 MB on an H200)."""

    @field_validator("max_reps")
    @classmethod
    def _not_below_min(cls, value: int, info: ValidationInfo) -> int:
        least = info.data.get("min_reps")
        if least is not None and value < least:
            raise ValueError(f"max_reps ({value}) is below min_reps ({least}): lower min_reps or raise max_reps")
        return value


class UserEvalSettings(EvalSettings):
    """EvalSettings as a user sets them: fresh inputs cannot be switched off. They are what no kernel can know in
    advance; only the worker's own single profiled launch (no correctness check) runs without them."""

    fresh_seeds: int = Field(default=2, ge=1)


NCU_SECTIONS: tuple[str, ...] = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
    "ComputeWorkloadAnalysis",
)
"""The ncu sections collected by default: throughput vs peak, memory, occupancy, launch, stalls, issue, pipes."""

NCU_RAW_METRICS: tuple[str, ...] = (
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
    "dram__bytes.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__t_sectors.sum",
    "l1tex__t_requests.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "lts__t_sector_hit_rate.pct",
    "smsp__inst_executed.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "launch__registers_per_thread",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
)
"""Raw metrics collected by default on top of the sections (most are in them already; listing them makes
sure they are there): what the classifier and the reward read."""


class ClassifierSettings(Section):
    """How a profile is classified (`kernelforge_tui.gpu.ncu.hardware`)."""

    threshold_pct: float = Field(default=30.0, gt=0, lt=100)
    """Below this % of peak for both SM and memory throughput, a kernel is latency-bound. 30% is the cut of
    the CUDAMaster hardware-analysis filter (Otsu's method over profiled kernels), see shared/seeds/."""
    top_stalls: int = Field(default=3, ge=0)
    """How many stall reasons a latency-bound report names."""


class ProfileSettings(Section):
    """How candidates are profiled (`kernelforge_tui.gpu.ncu.run`) and which ones the search profiles."""

    ncu: str | None = None
    """Path to ncu; found on PATH or under $CUDA_HOME/bin when unset."""
    timeout_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    """A profile that takes longer is killed (ncu replays the kernel once per counter pass, ~40 passes)."""
    sections: list[str] = Field(default_factory=lambda: list(NCU_SECTIONS))
    """ncu `--section`s to collect."""
    metrics: list[str] = Field(default_factory=lambda: list(NCU_RAW_METRICS))
    """Raw ncu `--metrics` to collect; a profile retries with the sections alone when ncu lacks one."""
    extra_args: list[str] = Field(default_factory=list)
    """More ncu flags, e.g. ["--cache-control", "none"] to profile with warm caches."""
    new_best: bool = True
    """The search profiles each new best node."""
    beats_parent: bool = True
    """The search profiles each node faster than its parent."""
    max_pending: int = Field(default=4, ge=0)
    """Automatic profiles waiting at most; more are skipped (a ProfileNode command is always queued)."""
    max_share: float = Field(default=0.25, gt=0, le=1, allow_inf_nan=False)
    """Share of wall time automatic profiling may hold a GPU lane (ncu replays the kernel ~40 times)."""
    classifier: ClassifierSettings = Field(default_factory=ClassifierSettings)


Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A reward weight or threshold: a negative one would turn a penalty into a prize, a NaN poisons every reward."""


class RewardWeights(Section):
    """Weights and thresholds of the reward (`kernelforge_tui.engine.reward`); the log speedup dominates."""

    speedup: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Weight of ln(speedup over the card's baseline): the measured gain, the core of the reward."""
    throughput: Weight = 0.2
    """Weight of the change in the bounding unit's throughput (% of peak / 100) against the parent:
    moving toward the roof is evidence of a real improvement."""
    dram_bytes: Weight = 0.1
    """Weight of -ln(child DRAM bytes / parent DRAM bytes): less traffic for the same work."""
    evidence_cap: Weight = 0.1
    """Hardware evidence in total is clipped to +-this, so it never outweighs a clear speed difference."""
    gain_threshold: Weight = 0.02
    """A child counts as having gained when it is at least this much faster than its parent (2%)."""
    registers: Weight = 0.1
    """Penalty weight of ln(child registers / parent registers) when more registers bought no gain."""
    shared_memory: Weight = 0.1
    """Penalty weight of ln(child / parent shared bytes per block) when more shared memory bought no gain."""
    spills: Weight = 0.2
    """Penalty weight of ln((1 + child spill bytes) / (1 + parent spill bytes)) when spilling bought no gain."""
    occupancy: Weight = 0.2
    """Penalty weight of the achieved-occupancy drop (/100) when the child is also slower than its parent."""
    judge: Weight = 0.1
    """Weight of the judge's score of an LLM edit, centred: weight * (2 * score - 1), so 0.5 is neutral and a node
    with no judge score gets no term."""
    failure: float = Field(default=-1.0, lt=0, allow_inf_nan=False)
    """The whole reward of a failed node (compile, launch, mismatch, timeout, cheat) when scored alone; in a
    search the tree's own `failure_reward` (TreeSettings) is the one used, so the two never disagree."""


# ---- LLM providers, models, roles and prices ---------------------------------------------------------------------
# Why only the key's variable name: the API key is read from the environment at call time and never stored, so it
# cannot reach the store, a log, an export or a repr.


class Timeouts(Section):
    connect_s: float = Field(default=10.0, gt=0)
    idle_s: float = Field(default=60.0, gt=0)
    """Longest wait for the response headers or the next line of the stream: a stalled provider is caught here."""
    total_s: float = Field(default=600.0, gt=0)
    """Whole call, retries and their waits included: once it is spent nothing is retried."""


class Retries(Section):
    max_attempts: int = Field(default=4, ge=1)
    backoff_s: float = Field(default=1.0, ge=0)
    """Attempt n waits about backoff_s * 2**(n-1), jittered, unless the server says how long (Retry-After)."""
    backoff_max_s: float = Field(default=30.0, ge=0)


class Limits(Section):
    """How much of a provider's answer is read: what a server sends is untrusted and may never end."""

    reply_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    """Most bytes read from one response, the stream's framing included (a streamed token costs a few hundred
    bytes): a reply past it fails the call, not retried."""
    error_bytes: int = Field(default=64 * 1024, ge=1)
    """Most bytes read of an error response, to say what went wrong; the rest is never read."""


HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
CLIENT_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection"})
"""Headers the HTTP client sets for the request it sends: a configured one would contradict it."""
SECRET_HEADER = re.compile(r"key|token|secret|auth|password|cookie", re.IGNORECASE)
"""What the name of a header that carries a secret holds (`api-key`, `Authorization`, `x-portkey-api-key`)."""


class ProviderSettings(Section):
    name: str = Field(min_length=1)
    protocol: Literal["openai", "anthropic"]
    base_url: str = Field(min_length=1)
    """OpenAI-compatible: up to and including the version, e.g. https://api.openai.com/v1 or http://localhost:8000/v1;
    Anthropic: without it, e.g. https://api.anthropic.com."""
    api_key_env: str | None = None
    """The NAME of the environment variable that holds the key; None for a local server that needs none."""
    max_concurrency: int = Field(default=4, ge=1)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    retries: Retries = Field(default_factory=Retries)
    limits: Limits = Field(default_factory=Limits)
    stream_options: bool = True
    """Protocol openai: ask for the usage at the end of each stream (`stream_options = {include_usage = true}`);
    false for a server that rejects the field (its calls' usage is then estimated, `llm.pricing`)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Headers sent with every request, as they are (a gateway's routing header, `anthropic-beta`, attribution such
    as OpenRouter's `HTTP-Referer` and `X-Title`); they win over the protocol's own. Never a secret: the run records
    them, so a name that reads like one (key, token, secret, auth, password, cookie) belongs in `headers_env`."""
    headers_env: dict[str, str] = Field(default_factory=dict)
    """Header name -> the NAME of the environment variable holding its value, read at call time like the key and
    masked like it (Azure's `api-key`, a gateway's own key)."""

    @field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @model_validator(mode="after")
    def _options_of_its_protocol(self) -> ProviderSettings:
        if not self.stream_options and self.protocol != "openai":
            raise ValueError(f"stream_options is an option of protocol openai, not {self.protocol}: remove it")
        return self

    @model_validator(mode="after")
    def _headers_fit(self) -> ProviderSettings:
        names = [name.lower() for name in [*self.headers, *self.headers_env]]
        for name in [*self.headers, *self.headers_env]:
            if not HEADER_NAME.fullmatch(name):
                raise ValueError(f"header {name!r} is not a header name: use letters, digits and - only")
            if name.lower() in CLIENT_HEADERS:
                raise ValueError(f"header {name!r} is set by the HTTP client: remove it")
            if names.count(name.lower()) > 1:
                raise ValueError(f"header {name!r} is given twice (names ignore case): keep one")
        for name, value in self.headers.items():
            if SECRET_HEADER.search(name):
                raise ValueError(
                    f"header {name!r} reads like a secret, and headers are recorded with the run: set it from the "
                    f'environment instead, headers_env = {{ "{name}" = "YOUR_VARIABLE" }}'
                )
            if not value.isprintable():
                raise ValueError(f"header {name!r}: its value holds a control character (a line break?): remove it")
        return self

    def api_key(self) -> str | None:
        """The key, read now from the environment (None when unset or empty)."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env) or None

    def secret_headers(self) -> dict[str, str | None]:
        """The headers read from the environment, read now (None where the variable is unset or empty)."""
        return {name: os.environ.get(env) or None for name, env in self.headers_env.items()}

    def secrets(self) -> list[str]:
        """Every secret the provider's requests carry that is set now: the key, the secret headers' values and the
        token of such a value that names its scheme (`Bearer TOKEN`); what is masked out of all that comes back."""
        values = [v for v in self.secret_headers().values() if v is not None]
        key = self.api_key()
        return ([key] if key is not None else []) + values + [v.split()[-1] for v in values if len(v.split()) > 1]


class Price(Section):
    """US dollars per million tokens. Prices with at most three decimals give costs that add up exactly (they are
    kept as integer nano-dollars: `llm.pricing.cost_nanousd`)."""

    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)
    cache_write: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Input tokens written to the provider's prompt cache; None: `CACHE_MULTIPLIERS` of the provider's protocol."""
    cache_read: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Input tokens read from the prompt cache; None: `CACHE_MULTIPLIERS` of the provider's protocol."""


CACHE_MULTIPLIERS: dict[str, tuple[float, float]] = {"anthropic": (1.25, 0.1), "openai": (1.0, 0.5)}
"""(cache write, cache read) as multiples of the input price, per wire protocol, for a price that gives no cache
prices of its own: Anthropic bills a 5-minute cache write at 1.25x and a read at 0.1x; OpenAI-compatible APIs bill no
write and (OpenAI's GPT-4o family) a read at 0.5x. Newer OpenAI models read at 0.25x or 0.1x: their entries in
DEFAULT_PRICES say so."""

DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4.1": Price(input=2.0, output=8.0, cache_read=0.5),
    "gpt-4.1-mini": Price(input=0.4, output=1.6, cache_read=0.1),
    "gpt-4o": Price(input=2.5, output=10.0, cache_read=1.25),
    "gpt-4o-mini": Price(input=0.15, output=0.6, cache_read=0.075),
    "gpt-5": Price(input=1.25, output=10.0, cache_read=0.125),
    "gpt-5-mini": Price(input=0.25, output=2.0, cache_read=0.025),
    "o3": Price(input=2.0, output=8.0, cache_read=0.5),
    "o4-mini": Price(input=1.1, output=4.4, cache_read=0.275),
    "claude-opus-4-1": Price(input=15.0, output=75.0, cache_write=18.75, cache_read=1.5),
    "claude-sonnet-4-5": Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.3),
    "claude-haiku-4-5": Price(input=1.0, output=5.0, cache_write=1.25, cache_read=0.1),
    "deepseek-chat": Price(input=0.27, output=1.1, cache_read=0.07),
    "deepseek-reasoner": Price(input=0.55, output=2.19, cache_read=0.14),
}
"""List prices (USD per million tokens, standard tier, as published by each vendor in 2025) of models people
commonly point this at, looked up by `price_key`. A user's `[llm.pricing]` entry or a model's own `price` wins."""

DATE_SUFFIX = re.compile(r"(?:-\d{4}-\d{2}-\d{2}|[-@]\d{8}|-latest)$")
"""A snapshot's date (`-20250929`, `-2024-08-06`, Vertex's `@20250929`) or `-latest`: the same model's price."""
VERSION_DOT = re.compile(r"(?<=\d)\.(?=\d)")


def price_key(model_id: str) -> str:
    """The id prices are looked up by: without a vendor prefix (`anthropic/`, OpenRouter's), a date suffix, case,
    and with a version's dot as a dash (OpenRouter's `claude-sonnet-4.5` is Anthropic's `claude-sonnet-4-5`)."""
    name = model_id.strip().lower().rsplit("/", 1)[-1]
    return VERSION_DOT.sub("-", DATE_SUFFIX.sub("", name))


def pricing_line(model_id: str) -> str:
    """The `[llm.pricing]` line that prices a model, for messages that ask for one."""
    return f'"{model_id}" = {{ input = 0.0, output = 0.0 }}'


ROLES: tuple[str, ...] = ("analyst", "planner", "coder", "debugger", "judge")


class ModelSettings(Section):
    """A model as the config names it: which provider serves it, its id there, and what each request carries."""

    name: str = Field(min_length=1)
    """The name roles use (e.g. "sonnet"); several names may point at one provider."""
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)
    """The id the provider knows (e.g. "claude-sonnet-4-5", "gpt-5", "qwen2.5-coder:32b")."""
    max_tokens: int = Field(default=8192, gt=0)
    max_tokens_limit: int | None = Field(default=None, gt=0)
    """The most output tokens the model accepts: a kernel reply cut off at max_tokens is asked for again with twice
    max_tokens, up to this. None: with max_tokens again (and a shorter request)."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Request fields sent as they are: temperature, reasoning_effort, thinking = {type = "enabled", ...}."""
    price: Price | None = None
    """Overrides the pricing table for this model."""

    @model_validator(mode="after")
    def _limit_above_budget(self) -> ModelSettings:
        if self.max_tokens_limit is not None and self.max_tokens_limit < self.max_tokens:
            raise ValueError(
                f"llm.models.{self.name}: max_tokens_limit ({self.max_tokens_limit}) is below max_tokens "
                f"({self.max_tokens}); raise max_tokens_limit to the model's output limit, or lower max_tokens"
            )
        return self


class RoleSettings(Section):
    """Which model plays which role (model names from [[llm.models]]). Only the coder is required."""

    analyst: str | None = None
    """None: the hardware-analysis layer's classification goes to the planner as it is (no call)."""
    planner: str | None = None
    """None: the coder's model plans."""
    coder: list[str] = Field(default_factory=list)
    """The pool: for a new card the top `pool_size` of these each write a first kernel; the first one writes
    the kernels after that (a router orders them by their past success on the op family)."""
    debugger: str | None = None
    """None: the coder's model repairs."""
    judge: str | None = None
    """None: no judge; the judge term of the reward is then 0."""


class AgentSettings(Section):
    """How the agent team works."""

    planning_rounds: int = Field(default=1, ge=1)
    """R: planner -> coder -> judge rounds per candidate; a round the judge scores below `judge_accept` goes back
    to the planner with the judge's critique while rounds remain."""
    debug_rounds: int = Field(default=2, ge=0)
    """D: how many times a failed agent kernel is sent to the debugger, one repair after the other."""
    judge_accept: float = Field(default=0.5, ge=0, le=1)
    pool_size: int = Field(default=2, ge=1)
    """K: how many pooled coder models write a first kernel for a new card."""
    expansions: int = Field(default=3, ge=1)
    """Nodes the team expands at once (each with its own calls, within each provider's max_concurrency)."""
    prompt_tokens: int = Field(default=12000, ge=1000)
    """A prompt's budget (estimated tokens); lineage and failures are summarised, oldest first, to fit."""
    record_text: bool = True
    """Store each call's prompt and reply; False keeps only their SHA-256 (tokens, cost and timing still)."""


class LlmSettings(Section):
    """`[llm]`: providers, models, roles, prices and the agent team's settings. Empty: no LLM (templates)."""

    providers: list[ProviderSettings] = Field(default_factory=list)
    models: list[ModelSettings] = Field(default_factory=list)
    roles: RoleSettings = Field(default_factory=RoleSettings)
    agents: AgentSettings = Field(default_factory=AgentSettings)
    pricing: dict[str, Price] = Field(default_factory=dict)
    """Model id -> price, over DEFAULT_PRICES; an id matches exactly, else by `price_key` (prefix, date, case)."""

    @model_validator(mode="after")
    def _consistent(self) -> LlmSettings:
        providers = [p.name for p in self.providers]
        models = [m.name for m in self.models]
        for kind, names in (("providers", providers), ("models", models)):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"llm.{kind}: names used twice: {twice}; give each its own name")
        for model in self.models:
            if model.provider not in providers:
                raise ValueError(
                    f"llm.models.{model.name}: no provider {model.provider!r}; add it under [[llm.providers]]"
                    f" (known: {', '.join(providers) or 'none'})"
                )
        for role in ROLES:
            for name in _names(getattr(self.roles, role)):
                if name not in models:
                    raise ValueError(
                        f"llm.roles.{role}: no model {name!r}; add it under [[llm.models]]"
                        f" (known: {', '.join(models) or 'none'})"
                    )
        if self.models and not self.roles.coder:
            self.roles.coder = [self.models[0].name]
        return self

    @property
    def configured(self) -> bool:
        """Whether any model is configured (the agent and hybrid proposers need one)."""
        return bool(self.models)

    def model(self, name: str) -> ModelSettings:
        return next(m for m in self.models if m.name == name)

    def provider(self, name: str) -> ProviderSettings:
        return next(p for p in self.providers if p.name == name)

    def price(self, model: ModelSettings) -> Price | None:
        """The model's price, with its cache prices filled in: its own, else the user's table (the exact id first),
        else the defaults, both by `price_key`; None when unknown."""
        key = price_key(model.model)
        listed = (p for table in (self.pricing, DEFAULT_PRICES) for i, p in table.items() if price_key(i) == key)
        found = model.price or self.pricing.get(model.model) or next(listed, None)
        if found is None:
            return None
        write, read = CACHE_MULTIPLIERS[self.provider(model.provider).protocol]
        return found.model_copy(
            update={
                "cache_write": found.input * write if found.cache_write is None else found.cache_write,
                "cache_read": found.input * read if found.cache_read is None else found.cache_read,
            }
        )

    def used_models(self) -> list[ModelSettings]:
        """The models the roles name (the coder pool, planner, analyst, debugger, judge), in config order."""
        named = {name for role in ROLES for name in _names(getattr(self.roles, role))}
        return [m for m in self.models if m.name in named]

    def unpriced(self, models: list[ModelSettings]) -> list[ModelSettings]:
        """Those of `models` with no price anywhere: a money budget cannot count what they cost."""
        return [m for m in models if self.price(m) is None]


def _names(value: str | list[str] | None) -> list[str]:
    """The model names a role setting holds (the coder's is a list, the others one name or None)."""
    return value if isinstance(value, list) else [value] if value else []


class FileSettings(BaseSettings):
    """Settings read from arguments, then KERNELFORGE_* variables, then one table of the config file."""

    toml_table: ClassVar[tuple[str, ...]] = ()
    """The config file's table these settings live in (empty: the top level)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments beat the environment, which beats the TOML file."""
        try:
            file = TomlConfigSettingsSource(settings_cls, toml_file=config_file(), toml_table_header=cls.toml_table)
        except KeyError:  # the file has no such table: these settings keep their defaults
            file = TomlConfigSettingsSource(settings_cls, toml_file=None)
        return (init_settings, env_settings, file)


class ClusterSettings(Section):
    """`[cluster]`: a search's builds and evaluations on a Dask cluster (`--cluster tcp://scheduler:8786`)."""

    address: str | None = None
    """The scheduler to use when a command is given no --cluster (None: this machine's GPUs)."""
    wait_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    """How long a search waits at its start for a worker with the GPU resource before it gives up."""
    poll_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """How often the scheduler is asked which workers are there (workers that come and go are picked up)."""
    resubmits: int = Field(default=3, ge=0)
    """A task the cluster lost as a whole (the scheduler restarted), or that raised on its GPU worker (not the
    candidate's fault: a failing candidate is an evaluation, not an error), is sent again this many times. A worker
    that dies is Dask's own business: it runs the task elsewhere (`distributed.scheduler.allowed-failures` times)."""
    strikes: int = Field(default=3, ge=1)
    """A GPU worker whose tasks raise this many times in a row (no GPU after all, a driver or disk failing) is set
    aside for the rest of the process: a broken worker fails fast, so it would otherwise draw most of the work."""


class CaptureSettings(Section):
    """`[capture]`: how `kernelforge capture` runs the user's model."""

    timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """The model's import, build and forward passes may take this long in all; then the capture stops (`--timeout`
    sets it for one capture)."""


class Settings(FileSettings):
    """Everything a user can set. Nested fields use `__` in environment variables."""

    model_config = SettingsConfigDict(env_prefix="KERNELFORGE_", env_nested_delimiter="__", extra="ignore")

    build: BuildSettings = Field(default_factory=BuildSettings)
    eval: UserEvalSettings = Field(default_factory=UserEvalSettings)
    profile: ProfileSettings = Field(default_factory=ProfileSettings)
    reward: RewardWeights = Field(default_factory=RewardWeights)
    llm: LlmSettings = Field(default_factory=LlmSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    capture: CaptureSettings = Field(default_factory=CaptureSettings)


S = TypeVar("S", bound=BaseSettings)


def checked_settings(cls: type[S], table: str = "", **values: Any) -> S:
    """`cls` read from its sources (arguments, KERNELFORGE_* variables, the config file's `table`); a file or a
    variable that cannot be used is a ConfigError naming it, the field and the fix."""
    path = config_file()
    if path.exists() and not path.is_file():
        raise ConfigError(path, None, "not a file", "point KERNELFORGE_CONFIG at a TOML file")
    try:
        return cls(**values)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, None, f"not valid TOML ({exc})", "fix the TOML syntax") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, not_utf8(exc), "save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot be read ({exc.strerror})", "check its permissions") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"]]
        variable = str(cls.model_config.get("env_prefix", "")) + "__".join(loc).upper()
        where: object = variable if variable in os.environ else path
        field = ".".join([table, *loc] if table and where == path else loc)
        problem = str(first["msg"]).removeprefix("Value error, ")
        fix = "remove it or check its spelling" if first["type"] == "extra_forbidden" else "correct this value"
        raise ConfigError(where, field, problem, fix) from None


def load_settings() -> Settings:
    """Read the settings once for a command."""
    return checked_settings(Settings)
