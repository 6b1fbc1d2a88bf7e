import os

# keep test processes quiet and CPU-only whatever the machine
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# CPU mode is explicit (verl_ext.cpu): unit tests that build verl's engine in this process need it. Tests of the
# switch itself and the e2e runs start subprocesses with VERL_PLATFORM set or removed as their claim requires.
os.environ.setdefault("VERL_PLATFORM", "cpu")
