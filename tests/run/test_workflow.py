"""The Snakemake workflow: the paper grid's jobs (dry run), the Slurm profile's resources (dry
run, no Slurm needed) and the smoke grid run end to end in a temporary directory."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEFILE = REPO / "workflow" / "Snakefile"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
if not SNAKEMAKE.exists():
    SNAKEMAKE = shutil.which("snakemake")
if SNAKEMAKE is None:
    pytest.fail(
        "snakemake is not installed: `pip install -e .[workflow]` (ci/env.sh installs it).",
        pytrace=False,
    )


def snakemake(cwd, *args, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CCU_PROGRESS="0")
    cmd = [str(SNAKEMAKE), "--snakefile", str(SNAKEFILE), "--directory", str(cwd), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def jobs_of(output: str) -> list[str]:
    """The job blocks of a (dry) run's output, each starting ``rule <name>:``."""
    return re.split(r"\n(?=(?:local)?rule \w+:)", output)


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run: rule -> number of jobs."""
    assert "Job stats:" in output, output[-3000:]
    block = output.split("Job stats:", 1)[1]
    counts = {}
    for line in block.splitlines()[3:]:
        m = re.fullmatch(r"\s*(\w+)\s+(\d+)\s*", line)
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def test_dry_run_of_the_paper_grid_lists_exactly_its_jobs(tmp_path):
    """The paper's grid (workflow/config.yaml: 5 datasets x 11 methods, one seed) on three
    seeds (one dry run, not two: each parses the Snakefile in a process of its own): per seed,
    train and evaluate each method and one attack per dataset; per dataset one table and one
    reference copy; and the target rule. With jobs_per_gpu, every GPU job (train, attack)
    takes a GPU slot shared by that many jobs."""
    import yaml

    grid = yaml.safe_load((REPO / "workflow" / "config.yaml").read_text())
    assert (len(grid["datasets"]), len(grid["methods"]), grid["seeds"]) == (5, 11, [0])
    rc, out = snakemake(
        tmp_path, "--dry-run", "--cores", "1", "--config", "seeds=[0,1,2]", "jobs_per_gpu=4"
    )
    assert rc == 0, out[-3000:]
    per_seed = {"attack": 5, "evaluate": 55, "train": 55}  # one seed: 126 jobs in all
    assert job_counts(out) == {
        "all": 1,
        **{rule: 3 * n for rule, n in per_seed.items()},
        "reference": 5,
        "tables": 5,
        "total": 1 + 3 * sum(per_seed.values()) + 5 + 5,
    }
    jobs = jobs_of(out)
    gpu_jobs = [j for j in jobs if j.startswith(("rule train:", "rule attack:"))]
    assert len(gpu_jobs) == 180
    assert all("--gpu-slots" in j and "--jobs-per-gpu 4" in j for j in gpu_jobs)


def test_smoke_grid_names_each_datasets_folder_after_its_own_profile(tmp_path):
    """``smoke`` is scaled to each dataset's network (ccu.core.settings.SMOKE_SCALE): the grid asks
    for digits' runs under ``smoke`` and fmnist's under the scaled profile's name."""
    from ccu.run.config import get_profile

    smoke = REPO / "workflow" / "smoke.yaml"
    rc, out = snakemake(
        tmp_path, "--dry-run", "--configfile", str(smoke), "--config", "datasets=[digits,fmnist]"
    )
    assert rc == 0, out[-3000:]
    assert job_counts(out)["train"] == 12 and job_counts(out)["tables"] == 2
    scaled = get_profile("smoke", "fmnist")
    assert f"results/{scaled.training_label}/fmnist/seed0/CCU/trained.json" in out
    assert f"results/{scaled.label}/fmnist/seed1/adversarial/table1.json" in out
    assert "results/smoke/digits/seed0/CCU/trained.json" in out
    assert "results/smoke/fmnist/" not in out
    # ODIN is post hoc on Base: its job waits for Base's run of the same seed (the grid run end
    # to end below trains Base and CCU only)
    jobs = jobs_of(out)
    odin = [j for j in jobs if j.startswith("rule train:") and "method=ODIN" in j]
    assert len(odin) == 4  # 2 datasets x 2 seeds
    for job in odin:
        seed = re.search(r"seed=(\d+)", job).group(1)
        inputs = job.split("input:", 1)[1].splitlines()[0]
        assert f"/seed{seed}/Base/trained.json" in inputs, job


def test_a_wrong_grid_is_refused_before_any_job(tmp_path):
    """The Snakefile checks its grid before any job (each check's message:
    tests/test_cli.py::test_check_grid_names_the_wrong_key)."""
    rc, out = snakemake(tmp_path, "--dry-run", "--config", "methods=[Base,OE]")
    assert rc != 0 and "must include CCU" in out and "rule " not in out


def test_slurm_dry_run_renders_the_declared_resources(tmp_path):
    profile = REPO / "workflow" / "profiles" / "slurm"
    rc, out = snakemake(
        tmp_path, "--dry-run", "--profile", str(profile), "--config", "datasets=[mnist]"
    )
    assert rc == 0, out[-3000:]
    assert job_counts(out)["train"] == 11
    jobs = jobs_of(out)
    train = [j for j in jobs if j.startswith("rule train:")]
    evaluate = [j for j in jobs if j.startswith("rule evaluate:")]
    attack = [j for j in jobs if j.startswith("rule attack:")]
    assert len(train) == 11 and len(evaluate) == 11 and len(attack) == 1
    for job in train + attack:
        res = job.split("resources:", 1)[1].splitlines()[0]
        for want in ("gpu=1", "mem_mb=32000", "slurm_partition=gpu", "slurm_account=my-account"):
            assert want in res, (want, res)
    assert "runtime=720" in train[0] and "runtime=480" in attack[0]
    for job in evaluate:
        res = job.split("resources:", 1)[1].splitlines()[0]
        assert "gpu=1" not in res and "slurm_partition=cpu" in res and "mem_mb=8000" in res
    # the jobs run on the GPU the scheduler gives them (no local GPU slots under Slurm)
    assert "--device cuda" in train[0] and "--gpu-slots" in train[0]


#: the smoke grid's runs made smaller (1 epoch on 200 points, 3-step attacks): its jobs are
#: each a process of their own, the run's cost is mostly theirs (140 s of CI with the plain
#: smoke profile; the README's command itself is the same grid on ``smoke``)
GRID_SMALL = {"epochs": 1, "n_train": 200, "attack_steps": 3, "attack_restarts": 1}
#: the README grid's methods but ODIN (post hoc on Base: 4 of the 14 processes). Its job's wait
#: for Base is checked in the dry run above; ``ccu train --method ODIN`` on Base's run in
#: tests/run/test_pipeline.py, and every method's run in tests/book/test_chapter_runs.py
GRID_METHODS = ["Base", "CCU"]
#: one seed of the README grid's two (5 of its processes): the grid's fan-out to seeds is
#: checked in the dry runs above, ``ccu tables`` over two seeds' files in
#: tests/test_cli.py::test_a_smoke_run_trains_evaluates_attacks_tabulates_and_copies
GRID_SEEDS = [0]


def test_the_smoke_grid_runs_end_to_end_and_a_second_run_does_nothing(tmp_path):
    results, ref = tmp_path / "results", tmp_path / "reference"
    small = tmp_path / "small.yaml"
    small.write_text(json.dumps({"overrides": GRID_SMALL}))  # JSON is YAML
    config = ["--configfile", str(REPO / "workflow" / "smoke.yaml"), str(small)]
    config += ["--config", f"results={results}", f"reference={ref}"]
    config += [f"methods=[{','.join(GRID_METHODS)}]", f"seeds={GRID_SEEDS}"]
    from ccu.run.config import get_profile

    small_profile = get_profile("smoke", "digits", **GRID_SMALL)
    # the runs under the training's name, the attack's tables under the whole profile's
    label, trained = small_profile.label, small_profile.training_label
    assert trained != label
    start = time.perf_counter()
    rc, out = snakemake(tmp_path, "--cores", "2", *config)
    wall = time.perf_counter() - start
    assert rc == 0, out[-5000:]
    print(f"smoke grid (digits, Base/CCU, seed 0): {wall:.0f} s")
    counts = job_counts(out)
    assert counts["train"] == 2 and counts["evaluate"] == 2 and counts["attack"] == 1
    tables = results / label / "digits" / "tables"
    md = (tables / "tables.md").read_text()
    print(md)
    assert "mean ± sd over seeds [0]" in md
    t1 = pd.read_csv(tables / "table1.csv")
    assert set(t1.method) == set(GRID_METHODS) and (t1.n == 1).all()
    assert t1[(t1.method == "CCU") & (t1.key == "SR")]["mean"].iloc[0] == 0.0
    for seed in GRID_SEEDS:
        for m in GRID_METHODS:
            assert (
                results / "logs" / trained / "digits" / f"seed{seed}" / f"train.{m}.log"
            ).exists()
            cfg = json.loads(
                (results / trained / "digits" / f"seed{seed}" / m / "config.json").read_text()
            )
            assert cfg["seed"] == seed and cfg["profile"]["epochs"] == 1
    copied = json.loads((ref / label / "digits" / "table1.json").read_text())
    assert set(copied["methods"]) == set(GRID_METHODS) and copied["device"] == "cpu"
    rc, out = snakemake(tmp_path, "--cores", "2", *config)
    assert rc == 0 and "Nothing to be done" in out, out[-3000:]


def test_a_bad_jobs_per_gpu_is_refused(tmp_path):
    """(Its reach to every GPU job: the three-seed dry run of the paper grid above.)"""
    rc, out = snakemake(tmp_path, "--dry-run", "--config", "jobs_per_gpu=0")
    assert rc != 0 and "jobs_per_gpu must be a positive integer" in out
