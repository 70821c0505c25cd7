"""Placeholder until the CLI lands."""


def main() -> None:
    raise SystemExit("oomwatch: CLI not built yet")
