"""The previous release and upgrades to the current one (e2e/test_upgrade.py)."""
