"""The panels ``--help`` groups a run's options in."""

TARGET, WORKLOAD, LOAD, TELEMETRY, ENERGY, OUTPUT = (
    "Target",
    "Workload",
    "Load",
    "Telemetry",
    "Energy",
    "Output",
)
