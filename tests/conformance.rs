//! The conformance suite on the host backend, which every build has: every test runs.

gpumem_conformance::suite!(gpumem_core::host::Host, always);
