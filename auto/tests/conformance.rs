//! The conformance suite on the run-time-chosen backend. Every test runs: on a machine without
//! a GPU `Auto` chooses the host backend, which always has devices. With `GPUMEM_BACKEND=cuda`
//! (or `hip`) the same binary runs the suite on that backend, and a missing device fails it.

gpumem_conformance::suite!(gpumem_auto::Auto, always);
