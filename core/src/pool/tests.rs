//! Pool unit tests against the host backend and mock raw allocators.
