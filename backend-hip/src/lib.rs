//! gpumem HIP backend
