"""The package as users get it: version, public API, built-in configs shipped inside it, CLI flags."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

from helpers import aiperf_cmd, cli_env

import aiperf
from aiperf.config import BUILTIN_CONFIGS, load_config


def test_version_is_the_installed_distribution_version():
    """Installed as aiperf-hpc (the index's "aiperf" is another project), imported as aiperf; the ledger says aiperf."""
    from importlib import metadata

    from aiperf.engine.assembly import software_versions

    assert aiperf.DISTRIBUTION == "aiperf-hpc"
    assert aiperf.__version__ == metadata.version("aiperf-hpc")
    assert "aiperf-hpc" in metadata.packages_distributions()["aiperf"]
    assert software_versions("tensorflow")["aiperf"] == aiperf.__version__
    proc = subprocess.run(aiperf_cmd("--version"), capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"aiperf {aiperf.__version__}"


def test_every_public_name_resolves_and_import_stays_light():
    for name in aiperf.__all__:
        assert getattr(aiperf, name) is not None, name
    # A fresh interpreter: importing the package pulls in neither Ray nor a deep-learning framework.
    heavy = "('ray', 'keras', 'tensorflow', 'jax', 'torch')"
    code = f"import sys, aiperf; print(sorted(m for m in {heavy} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_unknown_public_name_is_an_attribute_error():
    try:
        aiperf.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_builtin_configs_are_package_data_not_repository_files():
    shipped = sorted(
        p.name[: -len(".yaml")] for p in (resources.files("aiperf") / "configs").iterdir() if p.name.endswith(".yaml")
    )
    assert shipped == sorted(BUILTIN_CONFIGS)
    for name in BUILTIN_CONFIGS:
        assert load_config(name).run.name  # loads from the package location


def test_layers_never_import_from_above():
    """errors/config -> metrics, datasets, training -> record -> cluster -> engine -> cli (docs in aiperf/__init__)."""
    import ast
    from pathlib import Path

    layer = {
        "errors": 0,
        "config": 0,
        "metrics": 1,
        "datasets": 1,
        "training": 1,
        "record": 2,
        "cluster": 3,
        "engine": 4,
        "cli": 5,
    }
    bottom = "aiperf.ledger.schema"  # the typed records: every layer reads and writes them
    root = Path(aiperf.__file__).parent
    problems = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        own = rel[0][:-3] if rel[0].endswith(".py") else rel[0]
        if own not in layer:
            continue
        own_layer = 0 if path == root / "record" / "schema.py" else layer[own]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aiperf."):
                target = node.module.split(".")[1]
                target_layer = 0 if node.module == bottom else layer.get(target, 0)
                if target in layer and target_layer > own_layer:
                    problems.append(f"{path.relative_to(root)} imports {node.module}")
    assert not problems, problems


def test_verbose_flag_logs_to_stderr_after_the_command_too():
    proc = subprocess.run(
        aiperf_cmd("flops", "-vv", "/nonexistent/arch.json"), capture_output=True, text=True, env=cli_env(), timeout=60
    )
    assert proc.returncode == 2
    assert "no such file" in proc.stderr


IMPORT_CHECK = """
import importlib, json, logging, os, pkgutil, sys, threading
import aiperf, nas
for framework in ("tensorflow", "keras", "matplotlib", "pandas", "optuna", "ray"):  # their own first import's effects
    importlib.import_module(framework)
names = sorted(m.name for pkg in (aiperf, nas) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."))
found = {}
for name in names:
    env, threads, handlers = dict(os.environ), set(threading.enumerate()), list(logging.getLogger().handlers)
    before = sorted(os.listdir("."))
    importlib.import_module(name)
    changes = []
    if dict(os.environ) != env:
        changes.append("environment " + ", ".join(sorted({k for k, _ in set(os.environ.items()) ^ set(env.items())})))
    started = [t.name for t in threading.enumerate() if t not in threads]
    if started:
        changes.append("threads " + ", ".join(started))
    if list(logging.getLogger().handlers) != handlers:
        changes.append("root logging handlers")
    if sorted(os.listdir(".")) != before:
        changes.append("files " + ", ".join(sorted(set(os.listdir(".")) - set(before))))
    if changes:
        found[name] = changes
print(json.dumps({"modules": len(names), "side_effects": found}))
"""


def test_every_module_imports_without_side_effects(tmp_path):
    """Importing any module of aiperf or nas changes nothing: no environment variable, thread, logging
    handler or file in the working directory (a module that sets a framework's environment on import
    would choose the backend for whoever imports it). The frameworks are imported first: what their own
    first import does (TensorFlow sets variables of its own) is theirs, not a module of ours."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"  # Keras makes ~/.keras when it is imported: that is its own
    home.mkdir()
    cwd.mkdir()
    env = {**cli_env(), "HOME": str(home)}
    env.pop("KERAS_BACKEND", None)
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["modules"] > 100  # every module was found and imported, not a handful
    assert out["side_effects"] == {}


def test_master_never_imports_the_model_builder_or_a_framework():
    code = (
        "import sys, aiperf.engine.master, aiperf.engine.run; "
        "print(sorted(m for m in ('aiperf.families.image.model', 'aiperf.families.image.trainer', 'keras', "
        "'tensorflow') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_no_test_folder_shadows_a_subpackage():
    """pytest puts tests/ on sys.path, so tests/nas/language/ (no __init__.py) is a namespace portion of
    the name `nas.language`; under setuptools' editable finder (what `pip install -e .` makes on a clean
    checkout) it won the import and 38 test modules failed to collect in CI. A test folder may share a
    top-level package's name, never the path of one of its sub-packages."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    clashes = [
        str(folder.relative_to(root))
        for folder in (root / "tests").rglob("*")
        if folder.is_dir()
        and len(folder.relative_to(root / "tests").parts) > 1
        and (root / folder.relative_to(root / "tests") / "__init__.py").is_file()
    ]
    assert clashes == []
