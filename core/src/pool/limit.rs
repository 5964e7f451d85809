//! Pool limits: `set_limit` arguments and the `GPUMEM_GPU_MEMORY_LIMIT` variable.

use crate::error::{Error, Result};

/// The environment variable that sets each new pool's limit: bytes (`"1073741824"`) or a
/// percentage of the device's memory (`"40%"`, `"70.5%"`). CuPy's `CUPY_GPU_MEMORY_LIMIT`.
pub const LIMIT_ENV: &str = "GPUMEM_GPU_MEMORY_LIMIT";

/// A pool limit as given by the user.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// At most this many bytes held from the device; 0 means unlimited.
    Bytes(usize),
    /// At most this fraction (0 to 1) of the device's total memory; 0 means unlimited, as CuPy.
    Fraction(f64),
}

impl Limit {
    /// Parses a limit string as CuPy's `_parse_limit_string`: a trailing `%` gives a fraction,
    /// anything else a byte count.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the text is not a number, or the fraction is out of `0..=1`.
    pub fn parse(text: &str) -> Result<Limit> {
        let text = text.trim();
        let bad = || Error::InvalidArgument(format!("{LIMIT_ENV}: cannot parse memory limit {text:?}"));
        let limit = if let Some(percent) = text.strip_suffix('%') {
            Limit::Fraction(percent.trim().parse::<f64>().map_err(|_| bad())? / 100.0)
        } else {
            Limit::Bytes(text.parse::<usize>().map_err(|_| bad())?)
        };
        limit.validate()?;
        Ok(limit)
    }

    /// Reads [`LIMIT_ENV`]; `None` when it is not set.
    ///
    /// # Errors
    ///
    /// As [`Limit::parse`].
    pub fn from_env() -> Result<Option<Limit>> {
        match std::env::var(LIMIT_ENV) {
            Ok(v) => Limit::parse(&v).map(Some),
            Err(_) => Ok(None),
        }
    }

    pub(crate) fn validate(self) -> Result<()> {
        match self {
            Limit::Fraction(f) if !(0.0..=1.0).contains(&f) => {
                Err(Error::InvalidArgument(format!("memory limit fraction out of range: {f}")))
            }
            _ => Ok(()),
        }
    }

    /// The limit in bytes for a device of `total` bytes (the fraction truncated, as CuPy's
    /// `size_t` conversion).
    pub(crate) fn bytes(self, total: usize) -> usize {
        match self {
            Limit::Bytes(b) => b,
            Limit::Fraction(f) => (f * total as f64) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cupy_examples() {
        assert_eq!(Limit::parse("40%").unwrap(), Limit::Fraction(0.4));
        assert_eq!(Limit::parse("70.5%").unwrap(), Limit::Fraction(0.705));
        assert_eq!(Limit::parse("100%").unwrap(), Limit::Fraction(1.0));
        assert_eq!(Limit::parse("0").unwrap(), Limit::Bytes(0));
        assert_eq!(Limit::parse("1073741824").unwrap(), Limit::Bytes(1 << 30));
        assert!(Limit::parse("lots").is_err());
        assert!(Limit::parse("-5").is_err());
        assert_eq!(
            Limit::parse("150%").unwrap_err().to_string(),
            "invalid argument: memory limit fraction out of range: 1.5"
        );
    }

    #[test]
    fn fraction_truncates() {
        assert_eq!(Limit::Fraction(0.5).bytes(1001), 500);
        assert_eq!(Limit::Fraction(0.0).bytes(1 << 40), 0);
    }
}
