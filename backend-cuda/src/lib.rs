//! gpumem CUDA backend
