"""Only what a CPU-only machine needs to run the real verl pipeline (see verl-on-cpu.md)."""


def activate_cpu_support_if_needed() -> None:
    """Placeholder until the CPU platform lands: does nothing."""
