"""The test processes stay free of gevent: locust monkey-patches the process that imports it, and a pytest-xdist
worker whose threads then wait on gevent's hub dies (`LoopExit`), so tests run locust in child processes only. Each
worker collects every test module before it runs a test, so an import at a module's top shows here."""

import sys


def test_no_test_module_imports_locust_into_the_test_process():
    assert "locust" not in sys.modules
