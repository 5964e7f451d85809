//! gpumem hooks
