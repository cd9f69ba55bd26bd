"""Settings: a config file or variable that cannot be read, or that would switch a protection off, is refused with
one line naming the file (or the variable), the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge_tui.config import ConfigError, EvalSettings, Settings, load_settings
from kernelforge_tui.errors import BadInput
from kernelforge_tui.tui.config import load_tui_settings


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("KERNELFORGE_CONFIG", str(path))
    return path


def test_the_defaults_hold_every_protection(config: Path) -> None:
    settings = load_settings()  # no file: the defaults, validated like any file
    assert settings == Settings() and settings.eval.fresh_seeds >= 1
    config.write_text("[eval]\nmin_reps = 5\nmax_reps = 5\nceiling_margin = 1.0\n[tui]\ntheme = 'light'\n")
    assert load_settings().eval.max_reps == 5  # the [tui] table belongs to the TUI, not an unknown section


@pytest.mark.parametrize(
    ("toml", "field", "words"),
    [
        ("[eval]\nflush_bytes = 0", "eval.flush_bytes", "greater than or equal to 134217728"),
        ("[eval]\nflush_bytes = 1048576", "eval.flush_bytes", "greater than or equal to 134217728"),
        ("[eval]\nceiling_margin = 100.0", "eval.ceiling_margin", "less than or equal to 1.5"),
        ("[eval]\nceiling_margin = 0.5", "eval.ceiling_margin", "greater than or equal to 1"),
        ("[eval]\nceiling_margin = nan", "eval.ceiling_margin", "finite number"),
        ("[eval]\nfresh_seeds = 0", "eval.fresh_seeds", "greater than or equal to 1"),
        ("[eval]\nmin_reps = 500", "eval.max_reps", "max_reps (400) is below min_reps (500)"),
        ("[eval]\nmin_reps = 50\nmax_reps = 10", "eval.max_reps", "below min_reps (50)"),
        ("[eval]\nmin_reps = 0", "eval.min_reps", "greater than or equal to 1"),
        ("[eval]\ntimeout_s = 0", "eval.timeout_s", "greater than 0"),
        ("[eval]\ntimeout_s = nan", "eval.timeout_s", "finite number"),
        ("[eval]\ntimeout_s = inf", "eval.timeout_s", "finite number"),
        ("[eval]\ntiming_budget_s = -1", "eval.timing_budget_s", "greater than 0"),
        ("[eval]\ntarget_rel_error = nan", "eval.target_rel_error", "finite number"),
        ("[build]\ntimeout_s = -1", "build.timeout_s", "greater than 0"),
        ("[build]\nmax_parallel = 0", "build.max_parallel", "greater than or equal to 1"),
        ("[profile]\ntimeout_s = nan", "profile.timeout_s", "finite number"),
        ("[profile]\nmax_share = nan", "profile.max_share", "finite number"),
        ("[reward]\nspeedup = 0", "reward.speedup", "greater than 0"),
        ("[reward]\nspills = -0.5", "reward.spills", "greater than or equal to 0"),
        ("[reward]\nthroughput = nan", "reward.throughput", "finite number"),
        ("[reward]\nfailure = 0.5", "reward.failure", "less than 0"),
        ("[eval]\nmin_rep = 5", "eval.min_rep", "Extra inputs are not permitted"),
        ('[eval]\nmin_reps = "many"', "eval.min_reps", "valid integer"),
    ],
)
def test_a_setting_that_switches_a_protection_off_is_refused(config: Path, toml: str, field: str, words: str) -> None:
    config.write_text(toml + "\n")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert (info.value.where, info.value.field) == (config, field)
    assert words in info.value.problem, info.value.problem
    assert str(info.value).startswith(f"{config}: {field}: ") and "Fix:" in str(info.value)
    assert "\n" not in str(info.value) and isinstance(info.value, BadInput) and info.value.exit_code == 2


def test_a_variable_is_named_instead_of_the_file(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFORGE_EVAL__FRESH_SEEDS", "0")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value).startswith("KERNELFORGE_EVAL__FRESH_SEEDS: eval.fresh_seeds: ")


def test_the_worker_alone_may_draw_no_fresh_inputs() -> None:
    """Its single profiled launch checks nothing; a user's settings always draw fresh inputs."""
    assert EvalSettings(fresh_seeds=0).fresh_seeds == 0
    with pytest.raises(ValueError, match="fresh_seeds"):
        Settings.model_validate({"eval": {"fresh_seeds": 0}})


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"[eval\nmin_reps = 3\n", "not valid TOML (Expected ']' at the end of a table declaration"),
        (b'[eval]\nnote = "caf\xe9"\n', "not UTF-8 text (byte 0xe9 at offset 18)"),
        (None, "not a file"),
    ],
)
def test_an_unreadable_config_file_is_refused(config: Path, content: bytes | None, words: str) -> None:
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)
    for load in (load_settings, load_tui_settings):
        with pytest.raises(ConfigError) as info:
            load()
        assert info.value.where == config and words in info.value.problem, info.value.problem


def test_the_tui_table_is_checked_the_same_way(config: Path) -> None:
    config.write_text("[tui]\nrefresh_hz = 0\n")
    with pytest.raises(ConfigError) as info:
        load_tui_settings()
    assert str(info.value).startswith(f"{config}: tui.refresh_hz: Input should be greater than 0")


LLM_TOML = """
[[llm.providers]]
name = "anthropic"
protocol = "anthropic"
base_url = "https://api.anthropic.com/"
api_key_env = "ANTHROPIC_API_KEY"

[[llm.models]]
name = "sonnet"
provider = "anthropic"
model = "claude-sonnet-4-5"
extra = { thinking = { type = "enabled", budget_tokens = 2048 } }

[[llm.models]]
name = "local"
provider = "anthropic"
model = "my-finetune"

[llm.roles]
planner = "sonnet"

[llm.pricing]
"my-finetune" = { input = 0.125, output = 0.5 }
"""


def test_llm_settings_read_from_the_file_and_the_environment(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config.write_text(LLM_TOML)
    monkeypatch.setenv("KERNELFORGE_LLM__AGENTS__DEBUG_ROUNDS", "5")
    llm = load_settings().llm
    assert llm.configured and llm.providers[0].base_url == "https://api.anthropic.com"  # no trailing slash
    assert llm.roles.coder == ["sonnet"]  # no coder named: the first model writes
    assert llm.model("sonnet").extra["thinking"]["budget_tokens"] == 2048 and llm.agents.debug_rounds == 5
    sonnet, local = llm.models
    assert llm.price(sonnet) is not None and llm.price(sonnet).output == 15.0  # the default table
    assert llm.price(local) is not None and llm.price(local).input == 0.125  # the user's table
    recorded = load_settings().model_dump_json()
    assert "api_key_env" in recorded and "sk-" not in recorded  # a run records the variable's name, never a key


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('\n[llm.roles]\njudge = "nobody"\n', "llm.roles.judge: no model 'nobody'"),
        ('\n[[llm.models]]\nname = "x"\nprovider = "openai"\nmodel = "m"\n', "no provider 'openai'"),
        ('\n[[llm.models]]\nname = "sonnet"\nprovider = "anthropic"\nmodel = "m"\n', "names used twice: ['sonnet']"),
        ("\n[llm.agents]\npool_size = 0\n", "llm.agents.pool_size"),
    ],
)
def test_a_broken_llm_setting_is_refused_with_the_fix(config: Path, extra: str, words: str) -> None:
    config.write_text(LLM_TOML.replace('\n[llm.roles]\nplanner = "sonnet"\n', "") + extra)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        load_settings()


FULL_TOML = (
    """
[build]
timeout_s = 50
[eval]
timeout_s = 20
[tui]
theme = "light"
[cluster]
wait_s = 30
"""
    + LLM_TOML
)
TABLES = ["build", "eval", "tui", "cluster", "llm"]


@pytest.mark.parametrize("missing", TABLES)
def test_every_table_may_be_missing_and_keeps_its_defaults(config: Path, missing: str) -> None:
    """The TUI read its own table with pydantic-settings' table header, which raised a KeyError (a crash of
    `kernelforge tui` and `open`) for a file without `[tui]`, as the LLM-only config in the docs is."""
    sections = [s for s in ("\n" + FULL_TOML).split("\n[") if s.strip()]
    kept = [s for s in sections if s.split("]")[0].lstrip("[").split(".")[0] != missing]
    config.write_text("".join("\n[" + s for s in kept))
    settings, tui = load_settings(), load_tui_settings()
    assert (settings.build.timeout_s == type(settings.build)().timeout_s) == (missing == "build")
    assert (settings.eval.timeout_s == type(settings.eval)().timeout_s) == (missing == "eval")
    assert (settings.cluster.wait_s == type(settings.cluster)().wait_s) == (missing == "cluster")
    assert settings.llm.configured == (missing != "llm")
    assert tui.theme == ("dark" if missing == "tui" else "light")
