"""Cache keys: the correct one and its namespace, the narrow schemes seen in the wild (to simulate
the bug), and (in `audit`) the generic auditor of anyone's key function."""

from specdec_core.keys.schemes import (
    DEFAULT_NAMESPACE,
    EXAMPLE_REQUEST,
    KEY_SCHEMA_VERSION,
    KEY_SCHEMES,
    cache_key,
    dict_key_adapter,
    key_scheme,
    namespace_prefix,
)

__all__ = ["DEFAULT_NAMESPACE", "EXAMPLE_REQUEST", "KEY_SCHEMES", "KEY_SCHEMA_VERSION", "cache_key", "dict_key_adapter",
           "key_scheme", "namespace_prefix"]
