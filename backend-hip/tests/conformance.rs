//! The conformance suite on the HIP backend. Without a GPU the tests show as ignored; with
//! `--include-ignored` a missing device fails them.

gpumem_conformance::suite!(gpumem_hip::Hip, on_device);
