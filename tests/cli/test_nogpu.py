"""`doctor` and `eval` on a machine without a GPU (CI): a clear message, the right exit code."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES

NO_DRIVER = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"


@pytest.fixture
def no_gpu_path(tmp_path: Path) -> str:
    """A PATH with nvcc and an nvidia-smi that finds no driver (first, so it hides a real one), as in a container
    without a GPU. nvcc's own directory is on it: the compiler sandbox sees the toolkit and the system, not a link to
    nvcc under /tmp, and eval builds before it asks for a GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NO_DRIVER)
    smi.chmod(0o755)
    nvcc = shutil.which("nvcc")
    assert nvcc is not None, "CI has nvcc"
    return os.pathsep.join([str(bin_dir), str(Path(nvcc).parent), str(Path(sys.executable).parent), "/usr/bin", "/bin"])


def kernelforge(*args: str, path: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=path, COLUMNS="1000")
    return subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_doctor_names_the_missing_gpu_and_the_fix(no_gpu_path: str) -> None:
    done = kernelforge("doctor", "--json", path=no_gpu_path)
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert checks["nvcc"]["ok"] and checks["nvcc"]["detail"].startswith("13.")
    assert not checks["gpu"]["ok"] and "no NVIDIA GPU" in checks["gpu"]["detail"]
    assert "NVIDIA GPU" in checks["gpu"]["fix"]
    sandbox = checks["compiler sandbox"]
    assert "MiB address space" in sandbox["detail"]  # the limits nvcc runs under, in every mode
    assert sandbox["ok"] or "bubblewrap" in sandbox["fix"]
    assert done.returncode == 3  # python and nvcc are there, so cards and builds work; but kernels cannot run
    shown = kernelforge("doctor", path=no_gpu_path)
    assert shown.returncode == 3
    assert "kernels build here but cannot run (missing: gpu" in shown.stdout


def test_eval_says_clearly_that_no_gpu_is_present(no_gpu_path: str) -> None:
    card = EXAMPLES / "cards" / "vector_add_f32"
    kernel = sorted((card / "candidates").glob("*.cu"))[0]
    done = kernelforge("eval", str(card), str(kernel), path=no_gpu_path)
    assert done.returncode == 3
    assert "no NVIDIA GPU found" in done.stdout
    as_json = kernelforge("eval", str(card), str(kernel), "--json", path=no_gpu_path)
    reply = json.loads(as_json.stdout)
    assert reply["ok"] is False and reply["error"] == "no-gpu" and "no NVIDIA GPU found" in reply["message"]
    assert as_json.returncode == 3


@pytest.mark.parametrize(
    ("source", "plan_block", "words"),
    [
        ("int i = threadIdx.x c[i] = a[i] + b[i];", 256, ["compile error", "line 1"]),  # a syntax error
        ("void* p = malloc(4);", 256, ["source check", "'malloc' is not allowed"]),
    ],
)
def test_eval_checks_the_source_the_build_and_the_plan_before_asking_for_a_gpu(
    no_gpu_path: str, tmp_path: Path, source: str, plan_block: int, words: list[str]
) -> None:
    kernel = tmp_path / "k.cu"
    kernel.write_text(
        f'extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {{ {source} }}\n'
    )
    plan = f'entry = "vadd"\ngrid = ["cdiv(n, {plan_block})"]\nblock = [{plan_block}]\nargs = ["a", "b", "c", "n"]\n'
    (tmp_path / "k.plan.toml").write_text(plan)
    done = kernelforge("eval", str(CARD), str(kernel), "--json", path=no_gpu_path)
    assert done.returncode == 1, done.stdout + done.stderr  # the candidate failed, on any machine (a plan that does
    # not fit the card is bad input, exit 2: tests/cli/test_edges.py)
    reply = json.loads(done.stdout)
    assert reply["ok"] is False and all(word in reply["reason"] for word in words), reply["reason"]
    assert "no NVIDIA GPU" not in done.stdout


def test_eval_of_a_kernel_that_builds_says_so_beside_the_missing_gpu(no_gpu_path: str) -> None:
    done = kernelforge("eval", str(CARD), str(KERNEL), path=no_gpu_path)
    one_line_error(done, 3, "no NVIDIA GPU found", "vec4_grid_stride.cu built and its launch plan fits the card")


def test_eval_names_a_broken_card(no_gpu_path: str, tmp_path: Path) -> None:
    (tmp_path / "card.toml").write_text('name = "x"\nfamily = "softmax"\nsizes = { rows = -1 }\n')
    kernel = tmp_path / "k.cu"
    kernel.write_text('extern "C" __global__ void k() {}\n')
    done = kernelforge("eval", str(tmp_path), str(kernel), path=no_gpu_path)
    assert done.returncode == 2
    assert "card.toml" in done.stdout and "Fix:" in done.stdout


# ---- every bad input is one line and its exit code, never a traceback ---------------------------------------

CARD = EXAMPLES / "cards" / "vector_add_f32"
KERNEL = CARD / "candidates" / "vec4_grid_stride.cu"


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The failure message: exit code `code`, no traceback, one line (the terminal is wide) holding `words`."""
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.returncode == code, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stdout
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def broken_card(tmp_path: Path, old: str, new: str) -> Path:
    card = tmp_path / "card"
    shutil.copytree(CARD, card)
    text = (card / "card.toml").read_text()
    assert old in text
    (card / "card.toml").write_text(text.replace(old, new, 1))
    return card


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ("seed = 1\n", "seed = -1\n", ["card.toml", "input_sets.0.seed", "greater than or equal to 0"]),
        ("n = 33554432", "n = 4611686018427387904", ["card.toml", "inputs.a.shape", "GiB"]),
        ("[baseline]\n", '[baseline]\nsource = "../../../../etc/hostname"\n', ["card.toml", "baseline.source"]),
        ('function = "vector_add"', 'function = "/tmp/anything.py:f"', ["card.toml", "reference.function"]),
        (
            'name = "seed_1"\nseed = 1',
            'name = "stored"\nfile = "stored.npz"',
            ["input_sets.stored.file", "not an .npz"],
        ),
    ],
)
def test_eval_refuses_a_bad_card_in_one_line(
    no_gpu_path: str, tmp_path: Path, old: str, new: str, words: list[str]
) -> None:
    card = broken_card(tmp_path, old, new)
    (card / "stored.npz").write_text("not a zip")
    one_line_error(kernelforge("eval", str(card), str(KERNEL), path=no_gpu_path), 2, *words)


def test_eval_refuses_unreadable_manifests_and_plans(no_gpu_path: str, tmp_path: Path) -> None:
    card = broken_card(tmp_path, 'name = "vector_add_f32"', 'name = "vector_add_\xe9"')
    (card / "card.toml").write_bytes((card / "card.toml").read_text().encode("latin-1"))
    one_line_error(kernelforge("eval", str(card), str(KERNEL), path=no_gpu_path), 2, "card.toml", "not UTF-8 text")
    (tmp_path / "dir.plan.toml").mkdir()
    done = kernelforge("eval", str(CARD), str(KERNEL), "--plan", str(tmp_path / "dir.plan.toml"), path=no_gpu_path)
    one_line_error(done, 2, "dir.plan.toml", "a directory")
    (tmp_path / "bad.plan.toml").write_bytes(b'entry = "\xff"\n')
    done = kernelforge("eval", str(CARD), str(KERNEL), "--plan", str(tmp_path / "bad.plan.toml"), path=no_gpu_path)
    one_line_error(done, 2, "bad.plan.toml", "not UTF-8 text")


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[eval\n", ["not valid TOML"]),
        ("[eval]\nfresh_seeds = 0\n", ["eval.fresh_seeds", "greater than or equal to 1"]),
        ("[eval]\nceiling_margin = 1e9\n", ["eval.ceiling_margin", "less than or equal to 1.5"]),
    ],
)
def test_a_malformed_config_is_one_line_and_a_failed_doctor_check(
    no_gpu_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, words: list[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(toml)
    monkeypatch.setenv("KERNELFORGE_CONFIG", str(config))
    one_line_error(kernelforge("eval", str(CARD), str(KERNEL), path=no_gpu_path), 2, str(config), *words)
    done = kernelforge("doctor", "--json", path=no_gpu_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    check = {c["name"]: c for c in json.loads(done.stdout)}["config"]
    assert not check["ok"] and check["detail"].startswith(str(config)) and check["fix"]
    assert all(word in check["detail"] for word in words)
    shown = kernelforge("doctor", path=no_gpu_path)
    assert shown.returncode == 1 and "config" in shown.stdout and "Traceback" not in shown.stdout + shown.stderr


def test_empty_and_damaged_runs(no_gpu_path: str, tmp_path: Path) -> None:
    from tests.store.test_run_writer import damaged_copy, events_page, new_run

    root = tmp_path / "runs"
    (root / "empty").mkdir(parents=True)
    (root / "empty" / "run.sqlite").write_bytes(b"")
    damaged = damaged_copy(root / "damaged", events_page())
    with sqlite3.connect(damaged / "run.sqlite") as conn:  # resumable here, without a GPU
        conn.execute("UPDATE run SET backend = 'simulated'")
    new_run(root / "good").close()
    card = EXAMPLES / "cards" / "softmax_bf16_4096x32768"  # the recorded run's card, where it is on this machine
    for run, words in ((root / "empty", "is not a run database"), (damaged, "the file is damaged")):
        one_line_error(kernelforge("open", str(run), path=no_gpu_path), 2, str(run / "run.sqlite"), words)
        done = kernelforge("optimize", str(card), "--resume", str(run), "--simulate", path=no_gpu_path)
        one_line_error(done, 2, str(run / "run.sqlite"), words)
    damaged_copy(root / "summary")  # a page the summary reads: `runs` skips it with a note
    listed = kernelforge("runs", "--root", str(root), "--json", path=no_gpu_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert sorted(Path(run["run_dir"]).name for run in json.loads(listed.stdout)) == ["damaged", "good"]
    notes = sorted(line for line in listed.stderr.splitlines() if line.startswith("note: skipped"))
    assert len(notes) == 2 and str(root / "empty") in notes[0] and str(root / "summary") in notes[1]


def test_eval_lists_the_stress_sets_the_card_skips_with_their_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A skipped set proves nothing about the kernel, so eval shows it beside the sets that ran (the evaluation
    itself is fabricated: no GPU here)."""
    from kernelforge_tui.cards.directory import Card
    from kernelforge_tui.cli import evaluate
    from kernelforge_tui.cli.main import main
    from kernelforge_tui.vocabulary.evaluation import EvalResult, Evaluation, SetCheck

    card = tmp_path / "card"
    shutil.copytree(EXAMPLES / "cards" / "softmax_f32_small", card)
    manifest = card / "card.toml"
    manifest.write_text(
        manifest.read_text().replace("[stress]\n", '[stress]\nskip = { fully-masked = "it writes 0 there" }\n')
    )
    kernel = sorted((card / "candidates").glob("*.cu"))[0]
    checks = [SetCheck(name="captured_0", ok=True, numel=10), SetCheck(name="stress:masked", ok=True, numel=10)]
    evaluation = Evaluation(ok=True, result=EvalResult(ok=True, checks=checks, deterministic=True))

    async def fabricated(card: Card, kernel: Path, plan: Path | None) -> Evaluation:
        return evaluation

    monkeypatch.setattr(evaluate, "_evaluate", fabricated)
    monkeypatch.setenv("COLUMNS", "1000")
    assert main(["eval", str(card), str(kernel)]) == 0
    out = capsys.readouterr().out
    assert "stress:fully-masked: skipped: it writes 0 there" in out
    assert out.count("skipped") == 1
    assert main(["eval", str(card), str(kernel), "--json"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["skipped_stress_sets"] == {"stress:fully-masked": "it writes 0 there"}
    assert Evaluation.model_validate(reply) == evaluation


def test_resuming_a_live_or_damaged_run_says_so_before_looking_for_a_gpu(no_gpu_path: str, tmp_path: Path) -> None:
    """`optimize --resume` becomes the run's writer first: a run another process writes, or a damaged one, is
    refused as such (exit 2, naming the writer or the file) on a machine without a GPU, not for the GPU (exit 3)."""
    from tests.conftest import ROOT
    from tests.store.test_run_writer import HOLDER, RECORDED, damaged_copy, events_page

    card = EXAMPLES / "cards" / "softmax_bf16_4096x32768"  # the recorded run's card: a run measured on a GPU

    def resume(run_dir: Path) -> tuple[int, dict[str, str]]:
        done = kernelforge("optimize", str(card), "--resume", str(run_dir), "--json", path=no_gpu_path)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout)

    def copy(name: str) -> Path:
        (tmp_path / name).mkdir()
        shutil.copy(RECORDED, tmp_path / name / RECORDED.name)
        return tmp_path / name

    code, reply = resume(copy("idle"))
    assert code == 3 and reply["error"] == "no-gpu"  # nothing else in the way: the missing GPU is what stops it
    damaged = damaged_copy(tmp_path / "damaged", events_page())  # a page only a replay reads
    code, reply = resume(damaged)
    assert code == 2 and reply["error"] == "bad-input"
    assert str(damaged / RECORDED.name) in reply["message"] and "the file is damaged" in reply["message"]
    live = copy("live")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(live)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    line = holder.stdout.readline()
    try:
        assert line.strip().isdigit(), holder.communicate()[1]
        code, reply = resume(live)
        assert code == 2 and reply["error"] == "bad-input"
        assert f"being written by pid {holder.pid}" in reply["message"]
    finally:
        holder.kill()
        holder.wait()
        if line.strip().isdigit():
            os.kill(int(line), 9)
