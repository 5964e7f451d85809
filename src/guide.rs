//! Guides: gpumem's subjects one at a time, each with a program that runs (every code block here
//! is a doc test). The files are `docs/guide/*.md` in the repository, readable on GitHub too.

#[doc = include_str!("../docs/guide/pool.md")]
pub mod pool {}

#[doc = include_str!("../docs/guide/streams.md")]
pub mod streams {}

#[doc = include_str!("../docs/guide/safety.md")]
pub mod safety {}

#[doc = include_str!("../docs/guide/statistics.md")]
pub mod statistics {}

#[doc = include_str!("../docs/guide/traces.md")]
pub mod traces {}

#[doc = include_str!("../docs/guide/environment.md")]
pub mod environment {}

#[doc = include_str!("../docs/guide/c-and-python.md")]
pub mod c_and_python {}

#[doc = include_str!("../docs/guide/verification.md")]
pub mod verification {}
