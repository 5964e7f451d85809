//! gpumem
