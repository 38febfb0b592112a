"""ftgovd: everything in this package runs as root in the daemon.

It imports nothing from governor.client, governor.cli, governor.sim or governor.pipeline, and no numpy, scikit-learn
or torch (tests/daemon/test_import_graph.py checks it).
"""
