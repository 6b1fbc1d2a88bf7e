import os

# keep test processes quiet and CPU-only whatever the machine
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: end-to-end runs of the real verl trainer (Ray, FSDP on gloo); slow")
