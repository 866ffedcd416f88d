"""Helpers the peer benchmark scripts share (imported from beside them: each script runs as
``python3 benches/peers/<script>.py`` or ``python3 bundle/peers/<script>.py``, and Python puts
the script's folder first on the import path).
"""

import os
import subprocess


def median(xs):
    """The median of a non-empty sequence (the mean of the middle two for an even count)."""
    s = sorted(xs)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2


def fmt(x, digits=3):
    """A number for a markdown table, or an em dash for a missing one."""
    return "—" if x is None else f"{x:.{digits}f}"


def commit_id(script_file):
    """The distgemm commit a result belongs to: DISTGEMM_COMMIT, else the bundle's MANIFEST.txt
    when the script runs from a bundle (bundle/peers/: the commit the bundle was built from,
    whatever checkout it was copied into), else git at the script's folder ("-dirty" with
    uncommitted changes to tracked files), else "unknown"."""
    env = os.environ.get("DISTGEMM_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(script_file))
    try:
        with open(os.path.join(here, "..", "MANIFEST.txt")) as f:
            for line in f:
                if line.startswith("commit: "):
                    rest = line[len("commit: ") :].strip()
                    return rest[:7] + ("-dirty" if "uncommitted" in rest else "")
    except OSError:
        pass
    git = ["git", "-C", here]
    try:
        head = subprocess.run(
            git + ["rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            git + ["status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def results_dir(out, script_file):
    """Where results go: ``out`` (the script's --out), else $DISTGEMM_BENCH_RESULTS, else
    benches/results beside the script's folder."""
    if out:
        return out
    if os.environ.get("DISTGEMM_BENCH_RESULTS"):
        return os.environ["DISTGEMM_BENCH_RESULTS"]
    return os.path.join(os.path.dirname(os.path.abspath(script_file)), "..", "results")
