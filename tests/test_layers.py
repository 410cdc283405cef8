"""The plain layer imports no Lightning: only the callback (and telemetry's logging functions) need it."""

import subprocess
import sys

PLAIN = ["anatomy", "churn", "collate", "config", "loaders", "memory", "padding", "plan_cache", "planner", "profile",
         "regions", "report", "run", "telemetry", "timing", "torch_internals", "verify", "watch"]


def test_the_plain_modules_import_with_lightning_blocked():
    code = (
        "import sys\n"
        "for name in ('lightning', 'pytorch_lightning', 'lightning_fabric'):\n"
        "    sys.modules[name] = None  # any import of it raises ImportError\n"
        f"for name in {PLAIN!r}:\n"
        "    __import__('compile_callback.' + name)\n"
        "assert not any(m.split('.')[0] in ('lightning', 'pytorch_lightning') for m in sys.modules if sys.modules[m] is not None)\n"
        "import compile_callback\n"
        "try:\n"
        "    compile_callback.CompileCallback\n"
        "except ImportError:\n"
        "    print('callback needs lightning')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "callback needs lightning"  # the control: the block is real


def test_the_callback_is_still_imported_from_the_package():
    import compile_callback
    from compile_callback import CompileCallback
    from compile_callback.callback import CompileCallback as Defined

    assert CompileCallback is Defined is compile_callback.CompileCallback
    assert "CompileCallback" in dir(compile_callback)
