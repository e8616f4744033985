"""One import name: the distribution installs `draftsmith` and nothing else at the top level.

The built wheel's top-level names, and the contract with a user's own repository: from a folder that
holds its own ``train.py``, ``eval/``, ``decode.py``, ``artifacts/`` and ``conf/config.yaml``, draftsmith
imports and composes its own config, and the user's modules stay the user's.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_installs_only_draftsmith(tmp_path):
    """Build the wheel from a copy of the checkout (no network: the installed setuptools) and read its names."""
    src = tmp_path / "src"
    top_level_junk = {"build", "dist", "runs", "registry", "sweeps", "outputs", "wandb"}

    def ignore(folder, names):
        return [n for n in names if n.startswith(".") or n.endswith(".egg-info") or n == "__pycache__"
                or (Path(folder) == ROOT and n in top_level_junk)]

    shutil.copytree(ROOT, src, ignore=ignore)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("draftsmith-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"draftsmith"}
    expected = {f"draftsmith/{room}/{p.relative_to(ROOT / room)}" for room in ("decode", "train", "eval", "artifacts")
                for p in (ROOT / room).rglob("*.py")}
    expected |= {f"draftsmith/conf/{p.relative_to(ROOT / 'conf')}" for p in (ROOT / "conf").rglob("*.yaml")}
    expected |= {"draftsmith/cli.py", "draftsmith/__main__.py"}
    assert expected <= set(names), sorted(expected - set(names))[:10]


def _user_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "user-repo"
    for folder in ("eval", "artifacts", "conf"):
        (repo / folder).mkdir(parents=True)
    (repo / "train.py").write_text("WHO = 'the user'\n")
    (repo / "eval" / "__init__.py").write_text("WHO = 'the user'\n")
    (repo / "decode.py").write_text("WHO = 'the user'\n")
    (repo / "artifacts" / "__init__.py").write_text("WHO = 'the user'\n")
    (repo / "conf" / "config.yaml").write_text("users_own_key: 1\n")
    return repo


def _run(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_a_users_own_train_eval_decode_and_conf_do_not_meet_ours(tmp_path):
    repo = _user_repo(tmp_path)
    code = ("import draftsmith.pipeline, draftsmith.config, draftsmith.train.trainer, draftsmith.eval.runner; "
            "import train, eval, decode, artifacts; "
            "print(train.WHO, eval.WHO, decode.WHO, artifacts.WHO, sep='|')")
    done = _run(["-c", code], repo)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "|".join(["the user"] * 4)


def test_python_m_draftsmith_composes_draftsmiths_own_config(tmp_path):
    done = _run(["-m", "draftsmith", "--cfg", "job"], _user_repo(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "users_own_key" not in done.stdout
    assert "stages:" in done.stdout and "pair:" in done.stdout and "method:" in done.stdout
