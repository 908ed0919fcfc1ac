"""`python tests/faults/paused.py MODULE:NAME GLOB -m PACKAGE ARGS...`: `python -m PACKAGE ARGS...` with the function
`NAME` of `MODULE` made to stop the process (SIGSTOP) after a call that leaves a file matching `GLOB`, so that a test
kills the stage at that point however slow the machine is, rather than racing it to the file (`kill_9_when`)."""

import glob
import importlib
import os
import runpy
import signal
import sys


def main() -> None:
    target, pattern, option, package, *args = sys.argv[1:]
    assert option == "-m", "paused.py MODULE:NAME GLOB -m PACKAGE ARGS..."
    module_name, _, name = target.partition(":")
    module = importlib.import_module(module_name)
    original = getattr(module, name)

    def stopping(*call_args, **kwargs):
        result = original(*call_args, **kwargs)
        if glob.glob(pattern):
            os.kill(os.getpid(), signal.SIGSTOP)
        return result

    setattr(module, name, stopping)
    sys.path.insert(0, os.getcwd())  # as `python -m` has it: the checkout's packages by their folder names
    sys.argv = [package, *args]
    runpy.run_module(package, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
