"""The configuration: the typed schema and its pure checks (schema), composing conf/ (compose),
the backend table (backends) and the checks that need this machine (local)."""
