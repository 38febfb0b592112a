"""What the daemon keeps and others read: the measurement store (measurements.py, SQLite, kept across reboots) and
the crash-safety state file (state.py, one boot). The daemon writes both; `ftgov history`, `report`, `model retrain`,
`restore` and `doctor` read them, so they live outside governor/daemon."""
