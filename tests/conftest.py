import os

# keep test processes quiet and CPU-only whatever the machine
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

