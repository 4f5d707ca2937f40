"""The pointer policy, the default family: everything of it lives here, and only the registry
(common/policies/__init__.py) imports it."""
