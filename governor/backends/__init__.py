"""GPU backends: one module per kind of hardware behind the small protocol in base.py."""
