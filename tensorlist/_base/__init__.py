"""The ground floor: the C bindings, the dtype table, strict JSON, confined file access,
loaded-object and tree helpers, state checks and terminal escaping. Imports nothing above ``errors``."""
