from tests.runtime.conftest import local_run

__all__ = ["local_run"]
