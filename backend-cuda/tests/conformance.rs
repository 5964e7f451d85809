//! The conformance suite on the CUDA backend. Without a GPU the tests show as ignored; the GPU
//! machine runs them with `--include-ignored`, and there a missing device fails them.

gpumem_conformance::suite!(gpumem_cuda::Cuda, on_device);
