"""tools/test_costs.py: bad records and output paths are one line with an exit code."""

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "test_costs.py"


def run(*args):
    done = subprocess.run(
        [sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True
    )
    return done.returncode, done.stderr.strip().splitlines()


def test_bad_records_and_outputs_are_one_line(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"test": "a", "cpu_s": 1.5, "start": 0, "end": 2}\n')
    cases = [
        ('{"test": "a", "cpu_s": "x"}', 4, "no cpu_s number"),
        ('{"test": "a", "cpu_s": 1, "start": 0}', 4, "start and end"),
        ('{"cpu_s": 1}', 4, "no test name"),
        ("", 4, "holds no record"),
        ('{"test": "a"', 4, "not a CCU_TEST_CPU record"),
    ]
    for text, code, said in cases:
        f = tmp_path / "f.jsonl"
        f.write_text(text)
        rc, err = run(f)
        assert rc == code and len(err) == 1 and said in err[0], (text, err)
    rc, err = run(good, "--write", tmp_path / "missing" / "x.json")
    assert rc == 2 and len(err) == 1 and "existing folder" in err[0]
    rc, err = run(tmp_path / "nothing.jsonl")
    assert rc == 3 and len(err) == 1
    rc, _ = run(good, "--write", tmp_path / "costs.json")
    assert rc == 0 and (tmp_path / "costs.json").read_text().strip().startswith("{")
