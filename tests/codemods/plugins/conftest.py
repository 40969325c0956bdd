"""The plugins' own tests need the legacy stand-in on the path: ``test_plugins.py`` runs them in subprocesses."""

collect_ignore_glob = ["*/tests/*", "legacy_api/*", "*/*_plugin/*"]
